"""An explore run tracked on a real `mlflow server` (its own SQLite backend and artifact store, on 127.0.0.1):
metrics read back through the client, artifacts in the server's store and none on the run dir's disk."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from integration_settings import BASE
from mlflow import MlflowClient

from pipelines.explore import explore
from schemas.config import load_config
from schemas.run_dir import MLARTIFACTS, MLFLOW_DB

SERVER_START_S = (
    120.0  # the server imports MLflow and creates its tables (about 25 s on a busy 2-core machine)
)
STEPS = 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, log: Path) -> None:
    """Until `/health` answers OK; fails with the server's log if it exits or is not up in time."""
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"mlflow server not up within {SERVER_START_S:g} s:\n{log.read_text()[-3000:]}")


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
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=20)


@pytest.mark.timeout(300)
def test_an_explore_run_tracks_on_an_mlflow_server(server, engines, tmp_path):
    url, artifacts, process, log = server
    wait_healthy(url, process, log)
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
