"""A run's MLflow store, read through `mlflow.MlflowClient` on the run dir's own `mlflow.db`, its JSON
table artifacts read from the run dir's `mlartifacts/`, and the report logged back as an artifact.

The URIs recorded at run time are absolute (`sqlite:////abs/run/mlflow.db`, `file:///abs/run/mlartifacts`),
so a copied run dir would read, or write, the original's. Here both are derived from the run dir instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pipelines.control.commands import COMMAND_TAG
from pipelines.report_lib.runs import Run, artifact_dir, tracking_uri
from schemas.run_dir import MLFLOW_DB, STEP_PREFIX

log = logging.getLogger(__name__)

REPORT_ARTIFACT = "report"
FAILURES = "failures"
SAMPLES = "samples"
History = dict[str, list[tuple[int, float]]]  # metric name -> (step, value) by step


@contextmanager
def mlflow_client(run_dir: Path | str) -> Iterator[Any]:
    """An `MlflowClient` on the run's own `mlflow.db`, whose SQLite connections are closed afterwards
    (MLflow caches a store per URI for the process's life: a notebook would keep the file open)."""
    from mlflow import MlflowClient  # heavy, deferred: the CLI's --help and bad input answer without it

    for noisy in ("alembic", "mlflow.store.db.utils"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=tracking_uri(run_dir))
    try:
        yield client
    finally:
        store = getattr(getattr(client, "_tracking_client", None), "store", None)
        engine = getattr(store, "engine", None)
        if engine is not None:
            engine.dispose()


def metric_histories(run: Run) -> History:
    """Every metric of the run with all its steps, sorted by step ({} without a run id or store)."""
    if run.run_id is None or not run.has_mlflow:
        log.warning("%s: no MLflow run or store recorded in it; its metrics are left out", run.root)
        return {}
    from mlflow.exceptions import MlflowException  # heavy, deferred: as mlflow_client

    with mlflow_client(run.root) as client:
        try:
            names = sorted(client.get_run(run.run_id).data.metrics)
        except MlflowException as exc:
            log.warning(
                "%s: MLflow run %s not found (%s); its metrics are left out", run.root, run.run_id, exc
            )
            return {}
        histories = {name: client.get_metric_history(run.run_id, name) for name in names}
    return {
        name: sorted((int(m.step), float(m.value)) for m in history) for name, history in histories.items()
    }


def run_record(run: Run) -> dict[str, Any]:
    """The MLflow run's wall time (its first start to its last end, a resume's pause included) and the
    command it was started with; {} without a run id or store."""
    if run.run_id is None or not run.has_mlflow:
        return {}
    from mlflow.exceptions import MlflowException  # heavy, deferred: as mlflow_client

    with mlflow_client(run.root) as client:
        try:
            found = client.get_run(run.run_id)
        except MlflowException:
            return {}  # metric_histories has said so already
    start, end = found.info.start_time, found.info.end_time
    wall = f"{(end - start) / 1000:.1f} s" if start and end else f"not ended ({found.info.status})"
    return {"wall time": wall, "command": found.data.tags.get(COMMAND_TAG, "not recorded")}


def series(histories: History, name: str) -> tuple[list[int], list[float]]:
    """One metric's steps and values (empty lists when the run never logged it)."""
    points = histories.get(name, [])
    return [s for s, _ in points], [v for _, v in points]


def json_tables(run: Run, kind: str) -> list[dict[str, Any]]:
    """The rows of every `<kind>/step_NNNNNN.json` table artifact (`{"columns", "data"}`), each with its
    `step`, in step order; [] when there are none (a run without failures has no failures tables)."""
    folder = run.artifacts / kind if run.artifacts else None
    if folder is None or not folder.is_dir():
        return []
    rows = []
    for path in sorted(folder.glob(f"{STEP_PREFIX}*.json")):
        step = int(path.stem.removeprefix(STEP_PREFIX))
        table = json.loads(path.read_text(encoding="utf-8"))
        columns = table.get("columns", [])
        rows += [{"step": step, **dict(zip(columns, row, strict=True))} for row in table.get("data", [])]
    return rows


def failures(run: Run) -> list[dict[str, Any]]:
    """Every failed task of the run with its message, from the `failures/` artifacts."""
    return json_tables(run, FAILURES)


def recorded_artifact_dir(client: Any, run_id: str) -> Path | None:
    """Where MLflow recorded the run's artifacts, as a local path (None when not a local file URI)."""
    parsed = urlparse(client.get_run(run_id).info.artifact_uri)
    return Path(unquote(parsed.path)).resolve() if parsed.scheme in ("file", "") else None


def log_report(run: Run, folder: Path) -> Path | None:
    """Log `folder` as the run's `report/` artifact; where it went, or None (with a warning) when the run
    dir records no MLflow run.

    In the run dir where the run was made, MLflow's recorded artifact location is the run dir's own, and the
    client logs there. A copied or moved run dir records the original's: the report goes into the copy's
    `mlartifacts/` by the same layout, through MLflow's local artifact repository, and the original is left
    alone.
    """
    if run.run_id is None or not run.has_mlflow:
        what = "MLflow run id" if run.run_id is None else MLFLOW_DB
        log.warning("%s: no %s in the run dir; the report is not logged to MLflow", run.root, what)
        return None
    from mlflow.exceptions import MlflowException  # heavy, deferred: only logging needs it
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository  # heavy, deferred

    target = artifact_dir(run.root, run.run_id)
    with mlflow_client(run.root) as client:
        try:
            recorded = recorded_artifact_dir(client, run.run_id)
        except MlflowException as exc:
            log.warning(
                "%s: MLflow run %s not found (%s); the report is not logged", run.root, run.run_id, exc
            )
            return None
        if recorded == target:
            client.log_artifacts(run.run_id, str(folder), REPORT_ARTIFACT)
        else:
            log.info("%s was moved or copied; logging the report into its own %s", run.root, target)
            LocalArtifactRepository(target.as_uri()).log_artifacts(str(folder), REPORT_ARTIFACT)
    return target / REPORT_ARTIFACT


def step_table(histories: History, names: list[str]) -> list[dict[str, Any]]:
    """The metrics `names` side by side, one row per step any of them was logged at."""
    steps = sorted({step for name in names for step, _ in histories.get(name, [])})
    values = {name: dict(histories.get(name, [])) for name in names}
    return [{"step": step, **{name: values[name].get(step) for name in names}} for step in steps]
