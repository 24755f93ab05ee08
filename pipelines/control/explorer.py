"""The `Explorer`: Trinity-RFT's explorer API over rftflow's streaming dataflow.

One Ray Data stream carries every training step. `explore_step()` advances it until the next step commits,
then logs the step, starts an eval when one falls due, syncs weights when a sync falls due, and saves state.
Evals run in a background thread on the same engines, so eval at step k does not hold up step k+1.

The engines belong to an `EngineFleet`; the explorer, its evals, its benchmark and its weight syncer are
clients of it and never touch an engine's weights themselves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import ray

from operators.actors.names import NAMESPACE
from operators.engine.checkpoints import TensorMetaMap
from operators.sinks.base import open_sink
from operators.sinks.queue import QueueFeed, open_feed
from operators.tasks.reader import TasksetPlan
from pipelines.benchmark.session import benchmark_for_explorer
from pipelines.control.checks import check_bench_run_dir, check_inputs, check_local_defaults, check_run_dir
from pipelines.control.eval_schedule import EvalSchedule
from pipelines.control.feed import Feeder
from pipelines.control.fleet import EngineFleet
from pipelines.control.resume_check import check_resume
from pipelines.control.run_record import (
    relog_committed_steps,
    report_lost_carried,
    report_skipped_rows,
    write_config,
)
from pipelines.control.runtime import init_ray
from pipelines.control.state import ExplorerState, resume_state
from pipelines.control.step_report import StepReporter
from pipelines.control.steps import CommittedStep
from pipelines.control.stream import DRAIN_GRACE_S, end_stream, open_stream, release_period, start_behind_gate
from pipelines.control.tracking import MlflowMonitor, default_tracking_uri
from pipelines.control.weight_sync import ExplorerSync, SyncOutcome
from schemas.config import Config, flatten
from schemas.run_dir import RunDir
from schemas.run_end import mark_finished, reopen
from schemas.storage import Location, as_location, base_name, is_remote, make_dirs

log = logging.getLogger(__name__)


class Explorer:
    """Explores a taskset on vLLM engines: Trinity-RFT's API, async where Trinity-RFT's is async."""

    def __init__(
        self,
        config: Config,
        run_dir: Path | None = None,
        *,
        ray_address: str | None = None,
        mlflow_uri: str | None = None,
        progress: bool = True,
        verbose: bool = False,
        engines: EngineFleet | None = None,
    ):
        """`engines`: a started fleet to share (a test's, a benchmark script's); it is left running."""
        self.config = config
        where = as_location(run_dir or Path("runs") / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.run_dir: Location = where if is_remote(where) else Path(where).resolve()
        self.ray_address, self.verbose, self.progress = ray_address, verbose, progress
        self.explicit_mlflow_uri = mlflow_uri or config.monitor.mlflow_uri
        local = not is_remote(self.run_dir)  # else an explicit URI is required (`check_local_defaults`)
        self.tracking_uri = self.explicit_mlflow_uri or (default_tracking_uri(self.run_dir) if local else "")
        self.sink = open_sink(config.buffer.trainer_input.experience_buffer, self.run_dir)
        self.feed: QueueFeed | None = None  # the experience queue, when buffer.trainer_input asks for one
        self.fleet, self.owned = engines, False
        self.monitor: MlflowMonitor | None = None
        self.state = ExplorerState()
        self.plan: TasksetPlan | None = None
        self.feeder: Feeder | None = None  # a scheduled run's (several tasksets, or a selector)
        self.eval_plans: dict[str, TasksetPlan] = {}
        self.expected: TensorMetaMap = {}
        self.stream: Iterator[CommittedStep] | None = None
        self.drained: Future | None = None  # the training dataset's drain (`stream.drain_in_background`)
        self.forwarders: list[str] = []  # actor ids of the stream's forwarders, each ended at shutdown
        self.evals = EvalSchedule(config, self.run_dir)
        self.reporter: StepReporter | None = None
        self.gate: Any = None
        self.weights = ExplorerSync(config, self.run_dir, self.name)

    @property
    def name(self) -> str:
        return base_name(self.run_dir)

    @property
    def totals(self) -> dict[str, float]:
        """The run's totals so far (experiences, rewards, tokens, failed tasks), for its summary."""
        return self.reporter.totals if self.reporter else {}

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Check every input, then start Ray, the engines and MLflow; resume if the run dir holds a run."""
        cfg = self.config
        check_run_dir(self.run_dir)
        check_local_defaults(cfg, self.run_dir, self.explicit_mlflow_uri)
        inputs = check_inputs(cfg)
        check_resume(cfg, self.run_dir)  # before anything of this run is started or written
        self.plan, self.eval_plans, self.expected = inputs.plan, inputs.eval_plans, inputs.expected
        self.state = resume_state(self.run_dir, self.sink)
        if not reopen(self.run_dir, self.state.latest_step, self.plan.num_steps):
            return  # a finished run given again: nothing is started, and no stream opened
        if inputs.scheduled is not None:
            self.feeder = Feeder(inputs.scheduled)
            saved = self.state.selector_state
            self.state.selector_state = self.feeder.restore(saved, self.sink, self.state.latest_step)
        make_dirs(self.run_dir)
        init_ray(cfg.ray, self.ray_address, self.verbose)
        if self.fleet is None:
            self.fleet, self.owned = EngineFleet(cfg, self.name), True
            self.fleet.launch()
        # The stream starts behind a closed gate: Ray Data's pool starts and imports while the engines load
        # and the tracking store is set up. No task runs, and no fragment is written, before the gate opens.
        self._start_stream()
        # The tracking store (seconds of SQLite schema migrations) is set up while the engines load, and a
        # fresh run's first tasks may start before it is ready: their steps commit once it is.
        await asyncio.gather(asyncio.to_thread(self._open_tracking), self._open_engines())
        relog_committed_steps(self.monitor, self.sink)
        report_lost_carried(self.monitor, self.run_dir, self.state.latest_step, self.plan.num_steps)
        self.state.save(self.run_dir)
        self.evals.attach(self.fleet, self.monitor, self.eval_plans)
        for step in self.evals.missed(self.state.last_sync_step, self.state.latest_step):
            self.evals.start(step)
        if self.state.latest_step > 0:  # a crash may have come between a commit and its eval or sync
            await asyncio.to_thread(self._publish)  # a queue-fed trainer needs the step for its version
            await self._act_on_step()
        self._open_stream()

    def _open_tracking(self) -> None:
        """The MLflow run (a resumed run's own); a new run's params, config and skipped-row counts with it."""
        cfg = self.config
        experiment = cfg.monitor.experiment or cfg.project
        # On an object-store run dir the artifacts go where the tracking server keeps them.
        artifacts = None if is_remote(self.run_dir) else RunDir(self.run_dir).mlartifacts
        self.monitor = MlflowMonitor(
            self.tracking_uri, experiment, self.name, artifacts, self.state.mlflow_run_id
        )
        if self.state.mlflow_run_id is None:
            self.monitor.log_params(flatten(cfg))
            self.state.mlflow_run_id = self.monitor.run_id
            self.state.save(self.run_dir)  # at once: a crash from here on resumes this MLflow run
            write_config(cfg, self.run_dir)
            report_skipped_rows(self.monitor, cfg, self.plan, self.eval_plans)

    async def _open_engines(self) -> None:
        """Engines ready on the run's version, the experience queue open and a crashed run's uncommitted
        fragments dropped (those tasks run again); then a fresh run's first period is released. A resumed
        run's waits for the eval or sync its last commit may have missed (`prepare`)."""
        await asyncio.to_thread(self.fleet.wait)
        await asyncio.to_thread(self.weights.open, self.fleet, self.expected, self.state)
        self.fleet.watch(self.config.explorer)
        self.feed = open_feed(
            self.config.buffer.trainer_input.experience_buffer, self.name, self.sink.describe()
        )
        self.sink.discard_pending()
        if self.state.latest_step == 0:
            self._release_period()

    async def explore(self) -> str:
        """Run every remaining step, then wait for the evals; returns the explorer's name."""
        if self.plan is None:  # not prepared yet (a finished run's prepare opens no stream)
            await self.prepare()
        while self.stream is not None and await self.explore_step():
            pass
        mark_finished(self.run_dir, self.state.latest_step)  # a following reader stops here
        await asyncio.to_thread(self._close_feed, True)  # the trainer reads to the end of the stream
        await self.evals.finish(wait=True)
        self._close_bar()
        return self.name

    async def explore_step(self) -> bool:
        """Advance to the next committed step and act on it; False once the taskset is done."""
        done = await asyncio.to_thread(next, self.stream, None)
        if done is None:
            return False
        self.state.latest_step = done.step
        self.reporter.committed(done, self.fleet.restarts)
        if self.feeder is not None:  # before the next steps are drawn (`_act_on_step`)
            self.state.selector_state, figures = self.feeder.committed(done.step, done.experiences)
            self.monitor.log_metrics(figures, done.step)
        await asyncio.to_thread(self._publish, done)  # before a sync: the trainer may need this step first
        await self._act_on_step()
        self.state.task_index = min(done.step * self.config.buffer.batch_size, self.plan.total_tasks)
        self.state.save(self.run_dir)
        await self.evals.finish(wait=False)
        return True

    async def _act_on_step(self) -> None:
        """Start the eval and make the sync that fall due at the latest committed step, each at most once."""
        if self.need_eval():
            self.evals.start(self.state.latest_step)
        if await self.need_sync() and self.state.last_sync_step < self.state.latest_step:
            await self.sync_weight()
        # a sync opens the next period; any commit moves the staleness window on
        await asyncio.to_thread(self._release_period)

    async def shutdown(self) -> None:
        """Stop engines this explorer started, drop uncommitted fragments, close the MLflow run."""
        ok = self.plan is not None and self.state.latest_step >= self.plan.num_steps
        self.evals.shutdown()
        grace = DRAIN_GRACE_S if ok else 0.0
        self.forwarders += end_stream(self.gate, self.drained, grace)  # while their engines still run
        self.drained = None
        if self.fleet is not None:
            self.fleet.stop() if self.owned else self.fleet.unwatch()
        if self.gate is not None:
            ray.kill(self.gate)
        self.gate = None
        self.weights.close()
        self._close_feed(drain=ok)  # a failed run's queue goes at once; its committed steps stay in the store
        self.sink.discard_pending()
        self.sink.close()
        self._close_bar()
        if self.monitor is not None:
            self.monitor.close(ok)

    async def is_alive(self) -> bool:
        return True

    @classmethod
    def get_actor(cls, config: Config):
        """A named Ray actor running this class (one per config name), created if absent."""
        init_ray(config.ray)
        actor = ray.remote(cls).options(
            name=f"explorer/{config.name}", namespace=NAMESPACE, get_if_exists=True
        )
        return actor.remote(config)

    # -- eval ---------------------------------------------------------------------------------------------

    def need_eval(self) -> bool:
        return self.state.latest_step > 0 and self.evals.due(self.state.latest_step)

    async def eval(self) -> dict[str, float]:
        """Evaluate every eval taskset now, at the current step, and log the metrics."""
        step = self.state.latest_step
        metrics = await asyncio.to_thread(self.evals.run, step)
        self.evals.log_metrics(step, metrics)
        return metrics

    # -- weight sync (`weight_sync.ExplorerSync`) ---------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return self.weights.checkpoint_dir

    @property
    def hub_name(self) -> str:
        """The weight hub a trainer publishes to (memory and broadcast): `<run name>/weights`."""
        return self.weights.hub_name

    @property
    def hub(self) -> Any:
        """The weight hub actor (memory and broadcast), once `prepare` has opened the weight source."""
        return self.weights.hub

    async def need_sync(self) -> bool:
        return self.weights.need_sync(self.state)

    async def sync_weight(self) -> SyncOutcome:
        """Load the trainer's newest version into every engine, or keep the current one and say why."""
        if self.weights.syncer is None:
            raise RuntimeError("synchronizer.sync_method is none: there is no weight source to sync from")
        await self.evals.finish(wait=True)  # an eval measures one version
        return await self.weights.sync(self.state, self.monitor)

    async def setup_weight_sync_group(
        self, master_address: str, master_port: int, state_dict_meta: list | None = None
    ) -> None:
        """Every engine worker joins the trainer's torch.distributed group (trainer rank 0; gloo or NCCL)."""
        await self.weights.join_group(master_address, master_port, state_dict_meta)

    async def get_weight(self, name: str):
        """The named parameter as the first engine holds it (vLLM's parameter names, the engine's dtype)."""
        return await asyncio.to_thread(self.fleet.get_weight, name)

    async def save_checkpoint(self, sync_weight: bool = False) -> None:
        """Persist the explorer state (and sync first when asked)."""
        if sync_weight:
            await self.sync_weight()
        self.state.save(self.run_dir)

    async def benchmark(self) -> bool:
        """Benchmark the checkpoints in `checkpoint_dir` on the eval tasksets (see `pipelines.benchmark`).

        `bench_on_latest_checkpoint`: only the newest; `eval_on_startup`: the base model too (both when both
        are set, where Trinity-RFT drops the base). True when no checkpoint failed. After `prepare()` the
        child runs nest under this run and the engines go back to its version; without it, engines start
        here (and stop at `shutdown()`) and the benchmark makes a parent run of its own.
        """
        check_bench_run_dir(self.run_dir)
        await self.evals.finish(wait=True)  # the engines are about to change weights
        init_ray(self.config.ray, self.ray_address, self.verbose)
        if self.fleet is None:
            self.fleet, self.owned = EngineFleet(self.config, self.name), True
        return await asyncio.to_thread(
            benchmark_for_explorer,
            self.config,
            self.run_dir,
            self.fleet,
            self.checkpoint_dir,
            self.monitor,
            self.tracking_uri,
        )

    # -- internals --------------------------------------------------------------------------------------

    def _publish(self, done: CommittedStep | None = None) -> None:
        """Hand the experience queue every committed step it has not had (a resumed run's too), in order.

        Blocks while the queue is full: back-pressure from the trainer.
        """
        if self.feed is not None:
            fresh = {} if done is None else {done.step: done.experiences}
            self.state.published_step = self.feed.catch_up(self.sink, self.state.published_step, fresh)

    def _close_feed(self, drain: bool) -> None:
        if self.feed is not None:
            if drain:
                self._publish()
            feed, self.feed = self.feed, None
            left = feed.close(drain)
            if left:
                log.warning("%s: %d steps no trainer took are in %s", feed.name, left, self.sink.describe())

    @property
    def gate_name(self) -> str:
        return f"{self.name}/gate"

    def _start_stream(self) -> None:
        """The step gate, closed, and the training dataset draining behind it (`stream.start_behind_gate`)."""
        self.gate, self.drained = start_behind_gate(
            self.config, self.plan, self.fleet.names, self.sink.root, self.gate_name, self.state.latest_step
        )

    def _release_period(self) -> None:
        release_period(self.config, self.gate, self.state.latest_step, self.plan.num_steps, self.feeder)

    def _open_stream(self) -> None:
        """The committed-step stream from the step after the last committed one, over the drain started
        behind the gate (`_start_stream`)."""
        first = self.state.latest_step + 1
        self.reporter = StepReporter(
            self.config,
            self.monitor,
            self.plan.total_tasks,
            self.plan.num_steps,
            first,
            self.progress,
            self.fleet.counters,
        )
        self.stream = open_stream(
            self.config,
            self.plan,
            self.sink,
            self.run_dir,
            first,
            gate=self.gate,
            drained=self.drained,
            fleet=self.fleet,
            on_records=self.reporter.reported,
            reference_version=lambda: self.weights.reference_version(self.state),
        )

    def _close_bar(self) -> None:
        if self.reporter is not None:
            self.reporter.close()
