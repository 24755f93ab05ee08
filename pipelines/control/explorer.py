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
from functools import partial
from pathlib import Path
from typing import Any

import ray
import yaml

from operators.actors.gate import StepGate
from operators.actors.names import NAMESPACE, answer, on_this_node
from operators.engine.checkpoints import TensorMetaMap, check_checkpoint
from operators.rollout.runner import runs_per_task
from operators.sinks.base import open_sink
from operators.sinks.queue import QueueFeed, open_feed
from operators.tasks.reader import TasksetPlan
from pipelines.benchmark.session import benchmark_for_explorer
from pipelines.control.checks import check_bench_run_dir, check_inputs, check_local_defaults, check_run_dir
from pipelines.control.eval_schedule import EvalSchedule
from pipelines.control.fleet import EngineFleet, LoadError, WeightUpdate
from pipelines.control.metrics import experience_metrics, skipped_rows
from pipelines.control.plan import explore_dataset
from pipelines.control.resume_check import check_resume
from pipelines.control.runtime import init_ray
from pipelines.control.state import ExplorerState, lost_carried, resume_state, save_carried
from pipelines.control.step_report import StepReporter
from pipelines.control.steps import CommittedStep, StalenessBound, StepCommitter, committed_task_uids
from pipelines.control.stream import (
    DRAIN_GRACE_S,
    committed_steps,
    drain_in_background,
    end_stream,
)
from pipelines.control.sync_policy import read_trainer_status, release_boundary, sync_due
from pipelines.control.tracking import MlflowMonitor, default_tracking_uri
from pipelines.control.weight_sync import CheckpointSource, SyncOutcome, WeightSyncer, open_weight_source
from schemas.atomic import atomic_write_text
from schemas.config import Config, flatten
from schemas.run_dir import RunDir, checkpoint_dir_name, trainer_status_path
from schemas.run_end import mark_finished, reopen
from schemas.storage import Location, as_location, base_name, is_remote, make_dirs

log = logging.getLogger(__name__)


class Explorer:
    """Explores a taskset on vLLM engines: the reference API, async where the reference is async."""

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
        self.eval_plans: dict[str, TasksetPlan] = {}
        self.expected: TensorMetaMap = {}
        self.stream: Iterator[CommittedStep] | None = None
        self.drained: Future | None = None  # the training dataset's drain (`stream.drain_in_background`)
        self.forwarders: list[str] = []  # actor ids of the stream's forwarders, each ended at shutdown
        self.evals = EvalSchedule(config, self.run_dir)
        self.reporter: StepReporter | None = None
        self.gate: Any = None
        self.hub: Any = None
        self.syncer: WeightSyncer | None = None

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
        self._relog_committed_steps()
        self._report_lost_carried()
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
            self._write_config()
            self._report_skipped_rows()

    async def _open_engines(self) -> None:
        """Engines ready on the run's version, the experience queue open and a crashed run's uncommitted
        fragments dropped (those tasks run again); then a fresh run's first period is released. A resumed
        run's waits for the eval or sync its last commit may have missed (`prepare`)."""
        await asyncio.to_thread(self.fleet.wait)
        await asyncio.to_thread(self._open_weight_source)
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
        for actor in (self.gate, self.hub):
            if actor is not None:
                ray.kill(actor)
        self.gate = self.hub = None
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

    # -- weight sync ------------------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.config.synchronizer.checkpoint_dir or RunDir(self.run_dir).checkpoints).resolve()

    @property
    def hub_name(self) -> str:
        """The weight hub a trainer publishes to (memory and broadcast): `<run name>/weights`."""
        return f"{self.name}/weights"

    def _trainer_status_source(self) -> str | None:
        sync = self.config.synchronizer
        if sync.trainer_status or sync.sync_method == "none":
            return sync.trainer_status
        if sync.sync_method == "checkpoint":
            return str(trainer_status_path(self.checkpoint_dir))
        return f"actor:{self.hub_name}"

    async def need_sync(self) -> bool:
        sync = self.config.synchronizer
        if sync.sync_method == "none":
            return False
        trainer = (
            read_trainer_status(self._trainer_status_source())
            if sync.sync_style == "dynamic_by_trainer"
            else None
        )
        return sync_due(
            sync.sync_style,
            self.state.latest_step,
            interval=sync.sync_interval,
            offset=sync.sync_offset,
            last_sync_step=self.state.last_sync_step,
            model_version=self.state.model_version,
            trainer=trainer,
        )

    async def sync_weight(self) -> SyncOutcome:
        """Load the trainer's newest version into every engine, or keep the current one and say why."""
        if self.syncer is None:
            raise RuntimeError("synchronizer.sync_method is none: there is no weight source to sync from")
        await self.evals.finish(wait=True)  # an eval measures one version
        sync = self.config.synchronizer
        if sync.sync_method == "broadcast" and self.syncer.group is None:
            offer = await asyncio.to_thread(ray.get, self.hub.wait_offer.remote(sync.sync_timeout))
            if offer is not None:
                await self.setup_weight_sync_group(offer["master_address"], offer["master_port"])
        outcome = await asyncio.to_thread(self.syncer.sync, self.state.model_version)
        self.state.model_version = outcome.version
        self.state.last_sync_step = self.state.latest_step
        self.state.save(self.run_dir)  # before the metrics: after a crash, a sync is never logged twice
        if not outcome.ok:
            self.state.sync_failures += 1
            log.warning(
                "weight sync after step %d unsuccessful, exploring on with version %d: %s",
                self.state.latest_step,
                outcome.version,
                outcome.reason,
            )
        self.monitor.log_metrics(outcome.metrics(self.state.sync_failures), self.state.latest_step)
        if sync.max_staleness is not None:  # what can no longer commit in time stops sampling now
            floor = self._reference_version() - sync.max_staleness
            if aborted := await asyncio.to_thread(self.fleet.abort_older_than, floor):
                log.info("cancelled %d requests sampled before version %d (max_staleness)", aborted, floor)
        return outcome

    async def setup_weight_sync_group(
        self, master_address: str, master_port: int, state_dict_meta: list | None = None
    ) -> None:
        """Every engine worker joins the trainer's torch.distributed group (trainer rank 0; gloo or NCCL)."""
        timeout = self.config.synchronizer.sync_timeout
        await asyncio.to_thread(self.fleet.open_weight_group, master_address, master_port, timeout)
        self.syncer.group = {"address": master_address, "port": master_port, "meta": state_dict_meta}

    async def get_weight(self, name: str):
        """The named parameter as the first engine holds it (vLLM's parameter names, the engine's dtype)."""
        return await asyncio.to_thread(self.fleet.get_weight, name)

    def _open_weight_source(self) -> None:
        """The configured source, and the engines put back on the version a resumed run had reached."""
        sync = self.config.synchronizer
        if sync.sync_method != "none":
            self.syncer, self.hub = open_weight_source(
                self.config, self.fleet, self.checkpoint_dir, self.hub_name, self.expected,
                self._trainer_status_source(),
            )  # fmt: skip
        self._align_engines()

    def _align_engines(self) -> None:
        """Engines run the version the run has reached: a resumed run's (or a shared fleet's) may not."""
        target = self.state.model_version
        if self.fleet.version == target:
            return
        path = self.checkpoint_dir / checkpoint_dir_name(target)
        on_disk = self.syncer is not None and isinstance(self.syncer.source, CheckpointSource)
        if target > 0 and not (on_disk and path.is_dir()):
            log.warning("version %d is not on disk; going on from the base weights (version 0)", target)
            target = self.state.model_version = 0
        if target == 0:
            path = Path(self.config.model.model_path).resolve()
        else:
            check_checkpoint(path, self.expected, root=self.checkpoint_dir)
        try:  # part of the engines' start: bounded as a replacement's load is, not by sync_timeout
            self.fleet.load(
                WeightUpdate(target, "checkpoint", path=path), self.config.explorer.engine_restart_timeout
            )
        except LoadError as exc:
            raise RuntimeError(f"could not load version {target} from {path}: {exc}") from None

    def _reference_version(self) -> int:
        """The trainer's newest version: what staleness is measured against when a step commits."""
        newest = self.syncer.source.latest_version() if self.syncer is not None else 0
        return max(self.state.model_version, newest)

    async def save_checkpoint(self, sync_weight: bool = False) -> None:
        """Persist the explorer state (and sync first when asked)."""
        if sync_weight:
            await self.sync_weight()
        self.state.save(self.run_dir)

    async def benchmark(self) -> bool:
        """Benchmark the checkpoints in `checkpoint_dir` on the eval tasksets (see `pipelines.benchmark`).

        `bench_on_latest_checkpoint`: only the newest; `eval_on_startup`: the base model too (both when both
        are set, where the reference drops the base). True when no checkpoint failed. After `prepare()` the
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

    def _relog_committed_steps(self) -> None:
        """Steps committed just before a crash may have missed MLflow; log them once, never twice."""
        logged = self.monitor.logged_steps("pipeline/experience_count")
        for step in self.sink.committed_steps():
            if step not in logged:
                self.monitor.log_metrics(experience_metrics(self.sink.read_step(step)), step)

    def _report_lost_carried(self) -> None:
        """Tasks over-rollout moved on from the last committed step die with a crashed run: counted in
        `rollout/recycle_lost` at the next step and shown, never silently (they are not run again)."""
        lost = lost_carried(self.run_dir, self.state.latest_step)
        if lost and self.state.latest_step < self.plan.num_steps:
            step = self.state.latest_step + 1
            self.monitor.log_metrics({"rollout/recycle_lost": float(len(lost))}, step)
            log.warning(
                "%d tasks that step %d moved on to step %d (over-rollout recycle) were lost with the run "
                "that sampled them, and are not run again, e.g. %s", len(lost), step - 1, step, lost[:3],
            )  # fmt: skip

    def _report_skipped_rows(self) -> None:
        """Rows left out by `on_bad_row: skip`: counted in MLflow at step 0 and shown, never silently."""
        for name, (count, reasons) in skipped_rows(self.config, self.plan, self.eval_plans).items():
            self.monitor.log_metrics({f"pipeline/skipped_rows/{name}": float(count)}, 0)
            log.warning("taskset '%s': skipped %d bad rows, e.g. %s", name, count, reasons)

    def _write_config(self) -> None:
        text = yaml.safe_dump(self.config.public_dump(), sort_keys=False)
        atomic_write_text(RunDir(self.run_dir).config, text)

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
        """The step gate actor, closed (every step after the last committed one waits), and the training
        dataset draining behind it."""
        gate = ray.remote(StepGate).options(
            name=self.gate_name, namespace=NAMESPACE, num_cpus=0, **on_this_node()
        )
        self.gate = gate.remote(self.state.latest_step)
        first = self.state.latest_step + 1
        dataset = explore_dataset(
            self.config, self.plan, self.fleet.names, self.sink.root, self.gate_name, first
        )
        self.drained = drain_in_background(dataset)

    def _release_period(self) -> None:
        sync = self.config.synchronizer
        upto = release_boundary(
            sync.sync_method,
            sync.sync_style,
            latest_step=self.state.latest_step,
            num_steps=self.plan.num_steps,
            interval=sync.sync_interval,
            offset=sync.sync_offset,
            max_staleness=sync.max_staleness,
            partial=sync.partial_rollout,
        )
        answer(self.gate.release.remote(upto), "the step gate (release a period)")

    def _open_stream(self) -> None:
        """The committed-step stream from the step after the last committed one, over the drain started
        behind the gate (`_start_stream`)."""
        cfg, first = self.config, self.state.latest_step + 1
        self.reporter = StepReporter(
            cfg, self.monitor, self.plan.total_tasks, self.plan.num_steps, first, self.progress,
            self.fleet.counters,
        )  # fmt: skip
        repeats = runs_per_task(
            cfg.buffer.explorer_input.taskset.repeat_times, cfg.explorer.max_repeat_times_per_runner
        )
        staleness = StalenessBound(cfg.synchronizer.max_staleness, self._reference_version)
        committer = StepCommitter(
            self.plan, self.sink, first_step=first, rows_per_task=repeats, staleness=staleness,
            committed_uids=committed_task_uids(self.sink) if first > 1 else None,
            on_deferred=partial(save_carried, self.run_dir) if cfg.explorer.over_rollout.recycle else None,
        )  # fmt: skip
        self.stream = committed_steps(committer, self.drained, self.gate, self.fleet, self.reporter.reported)

    def _close_bar(self) -> None:
        if self.reporter is not None:
            self.reporter.close()
