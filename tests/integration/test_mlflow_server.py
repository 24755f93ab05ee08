"""An explore run tracked on a real `mlflow server` (its own SQLite backend and artifact store, on 127.0.0.1):
metrics read back through the client, artifacts in the server's store and none on the run dir's disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from integration_settings import BASE
from local_servers import end, free_port, http_ok, wait_up
from mlflow import MlflowClient

from pipelines.explore import explore
from schemas.config import load_config
from schemas.run_dir import MLARTIFACTS, MLFLOW_DB

SERVER_START_S = (
    120.0  # the server imports MLflow and creates its tables (about 25 s on a busy 2-core machine)
)
STEPS = 1


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A tracking server as users run one: its own backend store, artifacts served (proxied) from its own
    folder. Yields (URI, artifact folder, process, log) as soon as it is started, so that the shared engine
    (a session fixture too, requested after this one) starts while the server does; the test waits for it.
    The server's whole process group is ended whatever happens."""
    root = tmp_path_factory.mktemp("mlflow-server")
    artifacts, log = root / "artifacts", root / "server.log"
    port = free_port()
    command = [
        str(Path(sys.executable).with_name("mlflow")),
        "server",
        "--backend-store-uri", f"sqlite:///{root / 'backend.db'}",
        "--artifacts-destination", str(artifacts),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
    ]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}", artifacts, process, log
    finally:
        end(process, group=True, grace=20.0)


@pytest.mark.timeout(300)
def test_an_explore_run_tracks_on_an_mlflow_server(server, engines, tmp_path):
    url, artifacts, process, log = server
    wait_up("mlflow server", process, lambda: http_ok(f"{url}/health"), SERVER_START_S, log)
    cfg = load_config(None, [*BASE, f"buffer.total_steps={STEPS}"])
    summary = explore(cfg, tmp_path / "explore", mlflow_uri=url, progress=False, engines=engines)

    assert summary.tracking_uri == url and url in summary.browse
    client = MlflowClient(url)
    run = client.get_run(summary.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["buffer.batch_size"] == "4"
    for name in ("pipeline/experience_count", "rollout/reward/mean", "time/step"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, name)] == [1], name
    count = client.get_metric_history(run.info.run_id, "pipeline/experience_count")[0].value
    assert count == summary.experiences == 4 * 2

    # Artifacts go through the server into its store: the run names the server's proxy, and the files are in
    # the server's folder, under the run's id; the run dir holds neither a store nor artifacts.
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")
    logged = [f.path for f in client.list_artifacts(run.info.run_id, "samples")]
    assert logged == ["samples/step_000001.json"]
    stored = [p for p in artifacts.rglob("step_000001.json") if run.info.run_id in p.parts]
    assert len(stored) == 1 and stored[0].parent.name == "samples"
    assert not (summary.run_dir / MLARTIFACTS).exists()
    assert not (summary.run_dir / MLFLOW_DB).exists()
