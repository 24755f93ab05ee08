"""What the explorer records about a run when it opens, besides its steps: its config, the rows its tasksets
skip, and what a crash before this resume kept out of MLflow or lost. Each is logged and shown once, so
nothing a run leaves out is left out silently."""

from __future__ import annotations

import logging

import yaml

from operators.sinks.base import Sink
from operators.tasks.reader import TasksetPlan
from pipelines.control.metrics import experience_metrics, skipped_rows
from pipelines.control.state import lost_carried
from pipelines.control.tracking import MlflowMonitor
from schemas.atomic import atomic_write_text
from schemas.config import Config
from schemas.run_dir import RunDir
from schemas.storage import Location

log = logging.getLogger(__name__)


def write_config(cfg: Config, run_dir: Location) -> None:
    """The run's config as it ran, environment values and secrets hidden (`Config.public_dump`)."""
    text = yaml.safe_dump(cfg.public_dump(), sort_keys=False)
    atomic_write_text(RunDir(run_dir).config, text)


def report_skipped_rows(
    monitor: MlflowMonitor, cfg: Config, plan: TasksetPlan, eval_plans: dict[str, TasksetPlan]
) -> None:
    """Rows left out by `on_bad_row: skip`: counted in MLflow at step 0 and shown, never silently."""
    for name, (count, reasons) in skipped_rows(cfg, plan, eval_plans).items():
        monitor.log_metrics({f"pipeline/skipped_rows/{name}": float(count)}, 0)
        log.warning("taskset '%s': skipped %d bad rows, e.g. %s", name, count, reasons)


def relog_committed_steps(monitor: MlflowMonitor, sink: Sink) -> None:
    """Steps committed just before a crash may have missed MLflow; log them once, never twice."""
    logged = monitor.logged_steps("pipeline/experience_count")
    for step in sink.committed_steps():
        if step not in logged:
            monitor.log_metrics(experience_metrics(sink.read_step(step)), step)


def report_lost_carried(monitor: MlflowMonitor, run_dir: Location, latest_step: int, num_steps: int) -> None:
    """Tasks over-rollout moved on from the last committed step die with a crashed run: counted in
    `rollout/recycle_lost` at the next step and shown, never silently (they are not run again)."""
    lost = lost_carried(run_dir, latest_step)
    if lost and latest_step < num_steps:
        step = latest_step + 1
        monitor.log_metrics({"rollout/recycle_lost": float(len(lost))}, step)
        log.warning(
            "%d tasks that step %d moved on to step %d (over-rollout recycle) were lost with the run "
            "that sampled them, and are not run again, e.g. %s",
            len(lost),
            step - 1,
            step,
            lost[:3],
        )
