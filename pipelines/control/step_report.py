"""What the driver reports for each committed step: MLflow metrics and tables, the progress bar, console
lines (through `logging`) and the run's totals for the closing summary."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from pipelines.control.metrics import (
    failed_records,
    failure_table,
    sample_table,
    step_metrics,
    taskset_metrics,
)
from pipelines.control.steps import CommittedStep
from pipelines.control.throughput import (
    BusyClock,
    Window,
    generated_tokens,
    rate,
    sampling_window,
    union_seconds,
)
from pipelines.control.tracking import MlflowMonitor
from schemas.config import Config
from schemas.run_dir import failures_artifact, samples_artifact

log = logging.getLogger(__name__)


def failure_messages(records: pa.Table, limit: int = 3) -> list[str]:
    """A few failed tasks' messages, so a failing workflow is visible while the run goes on."""
    failed = failed_records(records)
    rows = failed.select(["task_uid", "message"]).slice(0, limit).to_pylist()
    more = len(failed) - len(rows)
    return [f"{r['task_uid']}: {r['message']}" for r in rows] + ([f"... and {more} more"] if more > 0 else [])


class StepReporter:
    """Per-step reporting and the run's totals; the bar counts tasks, not sub-runs."""

    def __init__(
        self,
        cfg: Config,
        monitor: MlflowMonitor,
        total_tasks: int,
        num_steps: int,
        first_step: int,
        progress: bool = True,
        counters: Callable[[], dict[str, float]] | None = None,
    ):
        """`counters`: the engines' running totals (`EngineFleet.counters`), read at each commit."""
        self.cfg, self.monitor, self.num_steps = cfg, monitor, num_steps
        self.counters = counters
        self.last = counters() if counters is not None else {}
        done_tasks = min((first_step - 1) * cfg.buffer.batch_size, total_tasks)
        self.bar = tqdm(
            total=total_tasks,
            initial=done_tasks,
            unit="task",
            desc="explore",
            dynamic_ncols=True,
            disable=not progress,
        )
        self.clock = BusyClock(time.time(), self.last.get("busy_s", 0.0))
        self.windows: list[Window] = []  # the committed steps' sampling windows (`throughput`)
        self.totals = {
            "experiences": 0,
            "multi_turn": 0,  # experiences of more than one turn
            "rewards": 0.0,
            "tokens": 0,
            "failed": 0,
            "skipped": 0,
            "sampling_s": 0.0,
        }
        self.step_rewards: dict[int, float] = {}

    def reported(self, records: pa.Table) -> None:
        """Sub-run records came in: advance the bar by the tasks they finish."""
        self.bar.update(pc.sum(pc.equal(records.column("run_id_base"), 0)).as_py() or 0)

    def committed(self, done: CommittedStep, engine_restarts: int) -> None:
        metrics = step_metrics(
            done.experiences, done.records, done.seconds, done.reference_version, done.dropped_stale
        )
        metrics["engine/restarts"] = float(engine_restarts)
        tasksets = self.cfg.buffer.explorer_input.training_tasksets
        if len(tasksets) > 1:
            metrics.update(taskset_metrics(done.experiences, [t.name for t in tasksets]))
        window = sampling_window(done.records)
        if window is not None:
            self.windows.append(window)
        if self.counters is not None:
            metrics.update(self.engine_metrics(window))
        if done.dropped_stale:
            log.warning(
                "step %d: dropped %d experiences more than %s versions behind version %d",
                done.step,
                done.dropped_stale,
                self.cfg.synchronizer.max_staleness,
                done.reference_version,
            )
        self.monitor.log_metrics(metrics, done.step)
        limit = self.cfg.monitor.sample_rollouts
        if limit and len(done.experiences):
            self.monitor.log_table(sample_table(done.experiences, limit), samples_artifact(done.step))
        if metrics["rollout/failed_tasks"]:
            self.monitor.log_table(failure_table(done.records), failures_artifact(done.step))
        totals = self.totals
        totals["experiences"] += len(done.experiences)
        totals["multi_turn"] += pc.sum(pc.greater(done.experiences.column("turns"), 1)).as_py() or 0
        totals["rewards"] += pc.sum(done.experiences.column("reward")).as_py() or 0.0
        totals["tokens"] += generated_tokens(done.experiences)
        totals["sampling_s"] = union_seconds(self.windows)
        totals["failed"] += int(metrics["rollout/failed_tasks"])
        totals["skipped"] += int(metrics["rollout/skipped_tasks"])
        if "rollout/reward/mean" in metrics:
            self.step_rewards[done.step] = metrics["rollout/reward/mean"]
        for message in failure_messages(done.records):
            log.warning("step %d: task failed: %s", done.step, message)
        self.bar.set_postfix(
            step=f"{done.step}/{self.num_steps}",
            tok_s=f"{rate(totals['tokens'], totals['sampling_s']):.0f}",
            reward=f"{metrics.get('rollout/reward/mean', float('nan')):.2f}",
        )

    def engine_metrics(self, window: Window | None) -> dict[str, float]:
        """The engines' idle ratio over the step's sampling window (`throughput`); since the last commit,
        tokens sampled by requests aborted as hopeless, and requests a sync cut to go on (partial rollout).
        A replaced engine counts afresh: hence the floor."""
        now = self.counters()
        delta = {key: max(0.0, now.get(key, 0.0) - self.last.get(key, 0.0)) for key in now}
        self.last = now
        self.clock.read(time.time(), now.get("busy_s", 0.0))
        engines = self.cfg.explorer.rollout_model.engine_num
        return {
            "rollout/idle_ratio": self.clock.idle_ratio(window, engines),
            "rollout/wasted_tokens": delta.get("wasted_tokens", 0.0),
            "rollout/preempted": delta.get("preempted", 0.0),
        }

    def close(self) -> None:
        self.bar.close()
