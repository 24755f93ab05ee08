"""Where the MLflow monitor puts a run's artifacts: the run dir with a local store, the server's store with a
tracking server (the server case runs for real in tests/integration/test_mlflow_server.py)."""

from __future__ import annotations

import pytest

from pipelines.control.tracking import MlflowMonitor, browse_hint, default_tracking_uri, is_tracking_server


@pytest.mark.parametrize(
    ("uri", "server"),
    [
        ("http://127.0.0.1:5000", True),
        ("https://mlflow.example.org", True),
        ("sqlite:////abs/run/mlflow.db", False),
        ("file:///abs/mlruns", False),
        ("postgresql://user@db/mlflow", False),
    ],
)
def test_only_http_uris_are_tracking_servers(uri, server):
    assert is_tracking_server(uri) is server
    assert (
        browse_hint(uri).startswith(uri)
        if server
        else " -m mlflow ui --backend-store-uri " in browse_hint(uri)
    )


def test_a_local_store_keeps_artifacts_in_the_run_dir(tmp_path):
    monitor = MlflowMonitor(default_tracking_uri(tmp_path), "exp", "run", tmp_path / "mlartifacts")
    try:
        monitor.log_table({"a": [1]}, "samples/step_000001.json")
        assert (tmp_path / "mlartifacts" / monitor.run_id / "artifacts" / "samples").is_dir()
    finally:
        monitor.close(ok=True)
