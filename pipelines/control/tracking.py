"""MLflow tracking from the driver only: the one wrapper for a run, its nested child runs, params, metrics,
tables and artifacts. The explorer logs its steps here, and the bench its checkpoints as child runs."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from pipelines.control.commands import COMMAND_TAG, invoked_command, mlflow_ui_command
from schemas.run_dir import RunDir

PARAMS_PER_BATCH = 100
PARAM_VALUE_LIMIT = 6000


SERVER_SCHEMES = ("http", "https")


def default_tracking_uri(run_dir: Path) -> str:
    """SQLite with an absolute path, so the store does not depend on the working directory."""
    return RunDir(run_dir).mlflow_uri


def is_tracking_server(tracking_uri: str) -> bool:
    """Whether `tracking_uri` is an MLflow tracking server (`http://host:port`): the server then owns where
    artifacts go (its `--artifacts-destination` or `--default-artifact-root`), not the run dir."""
    return urlparse(tracking_uri).scheme in SERVER_SCHEMES


def browse_hint(tracking_uri: str) -> str:
    """How a user looks at the run: the server's own UI, or `mlflow ui` on a local store."""
    if is_tracking_server(tracking_uri):
        return f"{tracking_uri} (the tracking server's UI)"
    return mlflow_ui_command(tracking_uri)


class MlflowMonitor:
    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        run_name: str,
        artifact_root: Path | None,
        run_id: str | None = None,
    ):
        """A new run, or `run_id` reopened (resume continues the same run).

        A new experiment keeps its artifacts under `artifact_root` (the run dir's `mlartifacts/`) when the
        store is local; on a tracking server it takes the server's artifact location, so every node and
        every user of the server sees them and no artifact is written on the driver's disk.
        """
        for noisy in ("alembic", "mlflow.store.db.utils"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        found = self.client.get_experiment_by_name(experiment)
        if found is None:
            # None: the tracking server's own artifact store, or, for a run dir on an object store, whatever
            # store the tracking URI names (there is no local run dir for artifacts)
            local = artifact_root is not None and not is_tracking_server(tracking_uri)
            location = Path(artifact_root).resolve().as_uri() if local else None
            experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        else:
            experiment_id = found.experiment_id
        if run_id is not None:
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
        else:
            tags = {COMMAND_TAG: invoked_command()}  # what the report's facts table shows as the command
            self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id

    def logged_steps(self, metric: str) -> set[int]:
        return {m.step for m in self.client.get_metric_history(self.run_id, metric)}

    @property
    def experiment_id(self) -> str:
        return self.client.get_run(self.run_id).info.experiment_id

    def log_params(self, params: dict[str, Any], run_id: str | None = None) -> None:
        """Params of this run (or of child `run_id`), values cut to MLflow's limit, in batches."""
        items = [Param(k, str(v)[:PARAM_VALUE_LIMIT]) for k, v in sorted(params.items())]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(run_id or self.run_id, params=items[start : start + PARAMS_PER_BATCH])

    def params(self, run_id: str | None = None) -> dict[str, str]:
        return self.client.get_run(run_id or self.run_id).data.params

    def log_metrics(self, metrics: dict[str, float], step: int, run_id: str | None = None) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(run_id or self.run_id, metrics=batch)

    def child(self, run_name: str, tags: dict[str, str], reuse: str | None = None) -> str:
        """A child run under this one (`mlflow.parentRunId`), or `reuse` reopened if it still exists."""
        if reuse is not None:
            with contextlib.suppress(Exception):  # deleted meanwhile: a new child is made below
                self.client.update_run(reuse, status="RUNNING")
                return reuse
        tags = {"mlflow.parentRunId": self.run_id, **tags}
        return self.client.create_run(self.experiment_id, run_name=run_name, tags=tags).info.run_id

    def end_child(self, run_id: str, ok: bool) -> None:
        self.client.set_terminated(run_id, status="FINISHED" if ok else "FAILED")

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def log_table(self, data: dict[str, list[Any]], artifact_file: str) -> None:
        """A table as a JSON artifact, `{"columns": [...], "data": [[row], ...]}` (MLflow's table layout).

        Not `MlflowClient.log_table`: it lists every table in one run tag, which passes MLflow's 8000-char
        limit after about 145 tables and then fails every later call (a 200-step run died at step 146).
        """
        columns = list(data)
        rows = [list(row) for row in zip(*data.values(), strict=True)]
        self.client.log_dict(self.run_id, {"columns": columns, "data": rows}, artifact_file)

    def close(self, ok: bool) -> None:
        """End the run and close the store's connections: MLflow caches a SQLite store per URI for the
        process's lifetime, so without this the run's `mlflow.db` stays open after the run has ended."""
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")
        store = getattr(getattr(self.client, "_tracking_client", None), "store", None)
        engine = getattr(store, "engine", None)
        if engine is not None:
            engine.dispose()  # the cached store opens new connections when next used
