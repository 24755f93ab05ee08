"""When evals run during exploration, and running them in the background on the fleet's engines.

An eval due at step k runs in one background thread while step k+1 explores, so it never holds up the
stream; a sync waits for it (`finish(wait=True)`), since an eval measures one version. Each step's eval is
logged once per MLflow run: after a crash, the steps it missed run again, and those it logged do not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from operators.tasks.reader import TasksetPlan
from pipelines.control.evaluate import evaluate
from pipelines.control.fleet import EngineFleet
from pipelines.control.metrics import eval_metrics
from pipelines.control.tracking import MlflowMonitor
from schemas.config import Config
from schemas.run_dir import RunDir
from schemas.storage import Location, join

log = logging.getLogger(__name__)


class EvalSchedule:
    """The explorer's evals: which steps are due, the one running, and their metrics logged once."""

    def __init__(self, config: Config, run_dir: Location):
        self.config, self.run_dir = config, run_dir
        self.plans: dict[str, TasksetPlan] = {}
        self.fleet: EngineFleet | None = None
        self.monitor: MlflowMonitor | None = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rftflow-eval")
        self.pending: dict[int, Future] = {}
        self.logged: set[int] = set()  # steps whose eval this run's MLflow run already holds

    def attach(self, fleet: EngineFleet, monitor: MlflowMonitor, plans: dict[str, TasksetPlan]) -> None:
        """The engines to run on and the run to log to, once the explorer has them."""
        self.fleet, self.monitor, self.plans = fleet, monitor, plans
        self.logged = monitor.logged_steps("eval/total_time")

    def due(self, step: int) -> bool:
        explorer = self.config.explorer
        due = explorer.eval_on_startup if step == 0 else step % explorer.eval_interval == 0
        return bool(self.config.buffer.explorer_input.eval_tasksets) and due

    def missed(self, last_sync_step: int, latest_step: int) -> list[int]:
        """Evals due at committed steps that this run has not logged: a crash cut them short.

        All of them come after the last sync (a sync waits for the running eval), so the engines still hold
        the version they were due to measure.
        """
        steps = range(last_sync_step, latest_step + 1)
        return [s for s in steps if self.due(s) and s not in self.logged]

    def start(self, step: int) -> None:
        """An eval of `step` in the background, unless one is running or logged (before a crash) already."""
        if self.config.buffer.explorer_input.eval_tasksets and step not in self.logged | set(self.pending):
            self.pending[step] = self.executor.submit(self.run, step)

    async def finish(self, wait: bool) -> None:
        """Log the evals that have ended; with `wait`, wait for the running one first."""
        for step, future in list(self.pending.items()):
            if wait or future.done():
                metrics = await asyncio.wrap_future(future)
                del self.pending[step]
                self.log_metrics(step, metrics)

    def run(self, step: int) -> dict[str, float]:
        """Each eval taskset whole, on the fleet's current weights; experiences kept under eval/step_N/."""
        started = time.monotonic()
        metrics: dict[str, float] = {}
        for taskset in self.config.buffer.explorer_input.eval_tasksets:
            out = join(RunDir(self.run_dir).eval_step(step), f"{taskset.name}.parquet")
            result = evaluate(self.config, self.fleet, taskset, self.plans[taskset.name], step, out)
            if len(result.experiences):
                metrics.update(eval_metrics(taskset.name, result.experiences, taskset.repeat_times))
            metrics[f"eval/{taskset.name}/failed_tasks"] = float(result.failed_tasks)
        metrics["eval/total_time"] = time.monotonic() - started
        return metrics

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.monitor.log_metrics(metrics, step)
        shown = ", ".join(
            f"{k.removeprefix('eval/')} {v:.3f}" for k, v in metrics.items() if k.endswith("/mean")
        )
        log.info("eval at step %d: %s", step, shown or "no experiences")

    def shutdown(self) -> None:
        """Drop evals not yet started; a running one ends on its own (its thread is not waited for)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
