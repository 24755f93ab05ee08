"""The `Explorer`: Trinity-RFT's explorer API over rftflow's streaming dataflow.

One Ray Data stream carries every training step. `explore_step()` advances it until the next step commits,
then logs the step, starts an eval when one falls due, syncs weights when a sync falls due, and saves state.
Evals run in a background thread on the same engines, so eval at step k does not hold up step k+1.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from operators.engine.checkpoints import CheckpointError, TensorMetaMap, check_checkpoint, tensor_meta
from operators.rollout.runner import runs_per_task
from operators.sinks.base import open_sink
from operators.sinks.queue import QueueFeed, open_feed
from operators.tasks.reader import TasksetPlan, plan_taskset
from pipelines.control.fleet import EngineLost, EngineSupervisor, Restore
from pipelines.control.metrics import (
    eval_metrics,
    experience_metrics,
    failure_table,
    sample_table,
    step_metrics,
)
from pipelines.control.runtime import (
    EngineSet,
    check_model_dir,
    init_ray,
    launch_engines,
    stop_engines,
    wait_engines,
)
from pipelines.control.state import ExplorerState
from pipelines.control.steps import CommittedStep, StalenessBound, StepCommitter
from pipelines.control.sync_policy import read_trainer_status, release_boundary, sync_due
from pipelines.control.tracking import MlflowMonitor, default_tracking_uri
from pipelines.control.weight_sync import CheckpointSource, HubSource, SyncOutcome, WeightSyncer
from schemas.config import Config, flatten
from schemas.errors import InputError


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
        engines: EngineSet | None = None,
    ):
        self.config = config
        self.run_dir = Path(
            run_dir or Path("runs") / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        ).resolve()
        self.ray_address, self.verbose, self.progress = ray_address, verbose, progress
        self.tracking_uri = mlflow_uri or config.monitor.mlflow_uri or default_tracking_uri(self.run_dir)
        self.sink = open_sink(config.buffer.trainer_input.experience_buffer, self.run_dir)
        self.feed: QueueFeed | None = None  # the experience queue, when buffer.trainer_input asks for one
        self.engines, self.owned = engines, None
        self.monitor: MlflowMonitor | None = None
        self.state = ExplorerState()
        self.plan: TasksetPlan | None = None
        self.eval_plans: dict[str, TasksetPlan] = {}
        self.stream: Iterator[CommittedStep] | None = None
        self.evals = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rftflow-eval")
        self.pending_evals: list[Future] = []
        self.logged_evals: set[int] = set()  # steps whose eval this run's MLflow run already holds
        self.started = time.monotonic()
        self.bar: Any = None
        self.gate: Any = None
        self.hub: Any = None
        self.syncer: WeightSyncer | None = None
        self.supervisor: EngineSupervisor | None = None
        self.expected: TensorMetaMap = {}

    @property
    def name(self) -> str:
        return self.run_dir.name

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Check every input, then start Ray, the engines and MLflow; resume if the run dir holds a run."""
        cfg = self.config
        buffer, explorer_input = cfg.buffer, cfg.buffer.explorer_input
        self.plan = plan_taskset(
            explorer_input.taskset, buffer.batch_size, buffer.total_epochs, buffer.total_steps
        )
        self.eval_plans = {
            ts.name: plan_taskset(ts, buffer.batch_size, 1, None) for ts in explorer_input.eval_tasksets
        }
        check_model_dir(cfg.model.model_path)
        self.expected = base_tensor_meta(cfg.model.model_path)
        check_workflows(cfg)
        self.state = self._resume_state()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        init_ray(cfg.ray, self.ray_address, self.verbose)
        if self.engines is None:
            self.engines = self.owned = launch_engines(cfg, self.name)
        # The tracking store is set up while the engines load their model.
        experiment = cfg.monitor.experiment or cfg.project
        artifacts = self.run_dir / "mlartifacts"
        self.monitor = MlflowMonitor(
            self.tracking_uri, experiment, self.name, artifacts, self.state.mlflow_run_id
        )
        if self.state.mlflow_run_id is None:
            self.monitor.log_params(flatten(cfg))
            self.state.mlflow_run_id = self.monitor.run_id
            self.state.save(self.run_dir)  # at once: a crash from here on resumes this MLflow run
            self._write_config()
            self._report_skipped_rows()
        await asyncio.to_thread(wait_engines, self.engines)
        await asyncio.to_thread(self._open_weight_source)
        self.supervisor = EngineSupervisor(cfg, self.engines, self._restore_point, self._say)
        self.supervisor.start()
        self._relog_committed_steps()
        self.feed = open_feed(cfg.buffer.trainer_input.experience_buffer, self.name, self.sink.describe())
        self.sink.discard_pending()  # fragments of steps a crashed run never committed: those tasks run again
        self.state.save(self.run_dir)
        self.logged_evals = self.monitor.logged_steps("eval/total_time")
        for step in self._missed_evals():
            self._start_eval(step)
        if self.state.latest_step > 0:  # a crash may have come between a commit and its eval or sync
            await asyncio.to_thread(self._publish)  # a queue-fed trainer needs the step for its version
            await self._act_on_step(release=False)
        self._open_gate()
        self._open_stream()

    async def explore(self) -> str:
        """Run every remaining step, then wait for the evals; returns the explorer's name."""
        if self.stream is None:
            await self.prepare()
        while await self.explore_step():
            pass
        await asyncio.to_thread(self._close_feed, True)  # the trainer reads to the end of the stream
        await self._finish_evals(wait=True)
        self._close_bar()
        return self.name

    async def explore_step(self) -> bool:
        """Advance to the next committed step and act on it; False once the taskset is done."""
        done = await asyncio.to_thread(next, self.stream, None)
        if done is None:
            return False
        self.state.latest_step = done.step
        self._log_step(done)
        await asyncio.to_thread(self._publish, done)  # before a sync: the trainer may need this step first
        await self._act_on_step()
        self.state.task_index = min(done.step * self.config.buffer.batch_size, self.plan.total_tasks)
        self.state.save(self.run_dir)
        await self._finish_evals(wait=False)
        return True

    async def _act_on_step(self, release: bool = True) -> None:
        """Start the eval and make the sync that fall due at the latest committed step, each at most once."""
        if self.need_eval():
            self._start_eval(self.state.latest_step)
        if await self.need_sync() and self.state.last_sync_step < self.state.latest_step:
            await self.sync_weight()
            if release:
                await asyncio.to_thread(self._release_period)

    async def shutdown(self) -> None:
        """Stop engines this explorer started, drop uncommitted fragments, close the MLflow run."""
        ok = self.plan is not None and self.state.latest_step >= self.plan.num_steps
        self.evals.shutdown(wait=False, cancel_futures=True)
        if self.supervisor is not None:
            self.supervisor.stop()
        stop_engines(self.owned)
        self.owned = None
        if self.gate is not None:
            import ray

            ray.kill(self.gate)
            self.gate = None
        if self.hub is not None:
            import ray

            ray.kill(self.hub)
            self.hub = None
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
        import ray

        from operators.actors.names import NAMESPACE

        init_ray(config.ray)
        actor = ray.remote(cls).options(
            name=f"explorer/{config.name}", namespace=NAMESPACE, get_if_exists=True
        )
        return actor.remote(config)

    # -- eval -------------------------------------------------------------------------------------------

    def need_eval(self) -> bool:
        return self.state.latest_step > 0 and self._eval_due(self.state.latest_step)

    def _eval_due(self, step: int) -> bool:
        explorer = self.config.explorer
        due = explorer.eval_on_startup if step == 0 else step % explorer.eval_interval == 0
        return bool(self.config.buffer.explorer_input.eval_tasksets) and due

    def _missed_evals(self) -> list[int]:
        """Evals due at committed steps that this run has not logged: a crash cut them short.

        All of them come after the last sync (a sync waits for the running eval), so the engines still hold
        the version they were due to measure.
        """
        steps = range(self.state.last_sync_step, self.state.latest_step + 1)
        return [s for s in steps if self._eval_due(s) and s not in self.logged_evals]

    async def eval(self) -> dict[str, float]:
        """Evaluate every eval taskset now, at the current step, and log the metrics."""
        step = self.state.latest_step
        metrics = await asyncio.to_thread(self._run_eval, step)
        self._log_eval(step, metrics)
        return metrics

    def _start_eval(self, step: int) -> None:
        """An eval of `step` in the background, unless one is running or logged (before a crash) already."""
        running = any(future.step == step for future in self.pending_evals)  # type: ignore[attr-defined]
        if self.config.buffer.explorer_input.eval_tasksets and step not in self.logged_evals and not running:
            future = self.evals.submit(self._run_eval, step)
            future.step = step  # type: ignore[attr-defined]
            self.pending_evals.append(future)

    async def _finish_evals(self, wait: bool) -> None:
        for future in list(self.pending_evals):
            if wait or future.done():
                metrics = await asyncio.wrap_future(future)
                self.pending_evals.remove(future)
                self._log_eval(future.step, metrics)  # type: ignore[attr-defined]

    def _run_eval(self, step: int) -> dict[str, float]:
        """Each eval taskset whole, through the same engines; experiences kept under eval/step_N/."""
        import pyarrow.parquet as pq

        from pipelines.control.plan import eval_dataset
        from schemas.status import flatten_experiences

        started = time.monotonic()
        metrics: dict[str, float] = {}
        for taskset in self.config.buffer.explorer_input.eval_tasksets:
            plan = self.eval_plans[taskset.name]
            dataset = eval_dataset(self.config, taskset, plan, self.engines.names, step)
            results = list(dataset.iter_batches(batch_format="pyarrow", batch_size=None))
            table = pa.concat_tables(results) if results else None
            experiences = flatten_experiences(table) if table is not None else None
            if experiences is not None and len(experiences):
                out = self.run_dir / "eval" / f"step_{step:06d}"
                out.mkdir(parents=True, exist_ok=True)
                pq.write_table(experiences, out / f"{taskset.name}.parquet")
                metrics.update(eval_metrics(taskset.name, experiences, taskset.repeat_times))
            failed = 0 if table is None else len(table) - pc.sum(table.column("ok")).as_py()
            metrics[f"eval/{taskset.name}/failed_tasks"] = float(failed)
        metrics["eval/total_time"] = time.monotonic() - started
        return metrics

    def _log_eval(self, step: int, metrics: dict[str, float]) -> None:
        self.monitor.log_metrics(metrics, step)
        shown = ", ".join(
            f"{k.removeprefix('eval/')} {v:.3f}" for k, v in metrics.items() if k.endswith("/mean")
        )
        self._say(f"eval at step {step}: {shown or 'no experiences'}")

    # -- weight sync ------------------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.config.synchronizer.checkpoint_dir or self.run_dir / "checkpoints").resolve()

    @property
    def hub_name(self) -> str:
        """The weight hub a trainer publishes to (memory and broadcast): `<run name>/weights`."""
        return f"{self.name}/weights"

    def _trainer_status_source(self) -> str | None:
        sync = self.config.synchronizer
        if sync.trainer_status or sync.sync_method == "none":
            return sync.trainer_status
        if sync.sync_method == "checkpoint":
            return str(self.checkpoint_dir / "trainer_status.json")
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
        await self._finish_evals(wait=True)  # an eval measures one version
        sync = self.config.synchronizer
        if sync.sync_method == "broadcast" and self.syncer.group is None:
            import ray

            offer = await asyncio.to_thread(ray.get, self.hub.wait_offer.remote(sync.sync_timeout))
            if offer is not None:
                await self.setup_weight_sync_group(offer["master_address"], offer["master_port"])
        outcome = await asyncio.to_thread(self._sync_engines)
        self.state.last_sync_step = self.state.latest_step
        self.state.save(self.run_dir)  # before the metrics: after a crash, a sync is never logged twice
        if not outcome.ok:
            self.state.sync_failures += 1
            self._say(
                f"weight sync after step {self.state.latest_step} unsuccessful, "
                f"exploring on with version {outcome.version}: {outcome.reason}"
            )
        self.monitor.log_metrics(outcome.metrics(self.state.sync_failures), self.state.latest_step)
        return outcome

    def _sync_engines(self) -> SyncOutcome:
        """The sync, with no engine being replaced meanwhile (a replacement must get the version in force)."""
        with self.supervisor.lock:
            outcome = self.syncer.sync(self.state.model_version)
            self.state.model_version = outcome.version
        return outcome

    def _restore_point(self) -> Restore:
        """Where a replacement engine gets the run's current version (called under the supervisor lock)."""
        version = self.state.model_version
        syncer = self.syncer
        if version == 0:
            return Restore(0)
        if syncer is not None and syncer.on_disk is not None and syncer.on_disk[0] == version:
            return Restore(version, path=syncer.on_disk[1])
        if syncer is not None and syncer.in_memory is not None and syncer.in_memory[0] == version:
            return Restore(version, state=syncer.in_memory[1])
        raise EngineLost(
            f"version {version} came by broadcast and cannot be loaded into a replacement engine; the run "
            "stops here with its committed steps kept (rerun with the same --run-dir to resume)"
        )

    async def setup_weight_sync_group(
        self, master_address: str, master_port: int, state_dict_meta: list | None = None
    ) -> None:
        """Every engine worker joins the trainer's torch.distributed group (trainer rank 0; gloo or NCCL)."""
        import ray

        rollout = self.config.explorer.rollout_model
        tp = rollout.tensor_parallel_size
        world = 1 + tp * len(self.engines.handles)
        backend = self._group_backend()
        timeout = self.config.synchronizer.sync_timeout
        calls = [
            engine.open_weight_group.remote(master_address, master_port, 1 + i * tp, world, backend, timeout)
            for i, engine in enumerate(self.engines.handles)
        ]
        await asyncio.to_thread(ray.get, calls)
        self.syncer.group = {"address": master_address, "port": master_port, "meta": state_dict_meta}

    def _group_backend(self) -> str:
        from pipelines.control.runtime import resolve_device

        return "nccl" if resolve_device(self.config) == "gpu" else "gloo"

    async def get_weight(self, name: str):
        """The named parameter as the first engine holds it (vLLM's parameter names, the engine's dtype)."""
        import ray

        return await asyncio.to_thread(ray.get, self.engines.handles[0].get_weight.remote(name))

    def _open_weight_source(self) -> None:
        """The configured source, and the engines put back on the version a resumed run had reached."""
        import ray

        from operators.actors.hub import WeightHub
        from operators.actors.names import NAMESPACE

        sync = self.config.synchronizer
        if sync.sync_method == "none":
            self._align_engines(None)
            return
        if sync.sync_method == "checkpoint":
            source = CheckpointSource(self.checkpoint_dir, self.expected, self._trainer_status_source())
        else:
            hub = ray.remote(WeightHub).options(
                name=self.hub_name, namespace=NAMESPACE, get_if_exists=True, num_cpus=0
            )
            self.hub = hub.remote()
            tp = self.config.explorer.rollout_model.tensor_parallel_size
            ray.get(self.hub.set_workers.remote(tp * len(self.engines.handles), self._group_backend()))
            source = HubSource(self.hub, sync.sync_method, self.expected)
        base = (0, Path(self.config.model.model_path).resolve())
        self.syncer = WeightSyncer(source, self.engines.handles, sync.sync_timeout, on_disk=base)
        self._align_engines(source)

    def _align_engines(self, source: CheckpointSource | HubSource | None) -> None:
        """Engines run the version the run has reached: a resumed run's (or reused engines') may not."""
        import ray

        from pipelines.control.weight_sync import gather

        target = self.state.model_version
        if all(v == target for v in ray.get([h.get_model_version.remote() for h in self.engines.handles])):
            return
        path = self.checkpoint_dir / f"global_step_{target}"
        if target > 0 and not (isinstance(source, CheckpointSource) and path.is_dir()):
            self._say(f"version {target} is not on disk; going on from the base weights (version 0)")
            target = self.state.model_version = 0
        if target == 0:
            path = Path(self.config.model.model_path).resolve()
        else:
            check_checkpoint(path, self.expected, root=self.checkpoint_dir)
        calls = [h.load_checkpoint.remote(str(path), target) for h in self.engines.handles]
        _, errors = gather(calls, self.config.synchronizer.sync_timeout)
        if errors:
            raise RuntimeError(f"could not load version {target} from {path}: {'; '.join(errors)}")
        if self.syncer is not None:
            self.syncer.on_disk = (target, path)

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
        """Benchmark the checkpoints in `checkpoint_dir` on the eval tasksets, through `pipelines.bench`.

        `bench_on_latest_checkpoint`: only the newest; `eval_on_startup`: the base model too (both when both
        are set, where the reference drops the base). True when no checkpoint failed.
        """
        from pipelines.bench import explorer_benchmark

        await self._finish_evals(wait=True)  # the engines are about to change weights
        return await asyncio.to_thread(explorer_benchmark, self)

    # -- internals --------------------------------------------------------------------------------------

    def _resume_state(self) -> ExplorerState:
        """The saved state, reconciled with the sink: committed step folders are the truth."""
        state = ExplorerState.load(self.run_dir) or ExplorerState()
        committed = self.sink.committed_steps()
        if committed and state.mlflow_run_id is None:
            raise RuntimeError(
                f"{self.run_dir}: holds committed steps but no explorer state; use a new run dir"
            )
        if state.latest_step and not committed:
            raise RuntimeError(
                f"{self.run_dir}: its state says step {state.latest_step} is committed, but "
                f"{self.sink.describe()} holds no step: give buffer.trainer_input.experience_buffer as in "
                f"{self.run_dir / 'config.yaml'}, or use a new run dir"
            )
        if committed:
            state.latest_step = max(committed)
        return state

    def _relog_committed_steps(self) -> None:
        """Steps committed just before a crash may have missed MLflow; log them once, never twice."""
        logged = self.monitor.logged_steps("pipeline/experience_count")
        for step in self.sink.committed_steps():
            if step not in logged:
                self.monitor.log_metrics(experience_metrics(self.sink.read_step(step)), step)

    def _report_skipped_rows(self) -> None:
        """Rows left out by `on_bad_row: skip`: counted in MLflow at step 0 and shown, never silently."""
        plans = {self.config.buffer.explorer_input.taskset.name: self.plan, **self.eval_plans}
        for name, plan in plans.items():
            if plan.skipped_rows:
                self.monitor.log_metrics({f"pipeline/skipped_rows/{name}": float(plan.skipped_rows)}, 0)
                reasons = "; ".join(plan.skip_messages)
                self._say(f"taskset '{name}': skipped {plan.skipped_rows} bad rows, e.g. {reasons}")

    def _write_config(self) -> None:
        import yaml

        text = yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False)
        (self.run_dir / "config.yaml").write_text(text)

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
                self._say(f"{feed.name}: {left} steps no trainer took are in {self.sink.describe()}")

    @property
    def gate_name(self) -> str:
        return f"{self.name}/gate"

    def _open_gate(self) -> None:
        """The step gate actor, with the first period released."""
        import ray

        from operators.actors.gate import StepGate
        from operators.actors.names import NAMESPACE

        gate = ray.remote(StepGate).options(name=self.gate_name, namespace=NAMESPACE, num_cpus=0)
        self.gate = gate.remote(self.state.latest_step)
        self._release_period()

    def _release_period(self) -> None:
        import ray

        sync = self.config.synchronizer
        upto = release_boundary(
            sync.sync_method,
            sync.sync_style,
            latest_step=self.state.latest_step,
            num_steps=self.plan.num_steps,
            interval=sync.sync_interval,
            offset=sync.sync_offset,
        )
        ray.get(self.gate.release.remote(upto))

    def _open_stream(self) -> None:
        from tqdm import tqdm

        first = self.state.latest_step + 1
        self.bar = tqdm(
            total=self.plan.total_tasks,
            initial=min((first - 1) * self.config.buffer.batch_size, self.plan.total_tasks),
            unit="task",
            desc="explore",
            disable=not self.progress,
            dynamic_ncols=True,
        )
        self.started = time.monotonic()
        self.totals = {"experiences": 0, "rewards": 0.0, "tokens": 0, "failed": 0}
        self.step_rewards: dict[int, float] = {}
        self.stream = self._committed_steps(first)

    def _committed_steps(self, first: int) -> Iterator[CommittedStep]:
        """Commit steps as the rollout batches report their records through the gate.

        A drain thread keeps Ray Data executing (it runs only while consumed); its outputs are not needed.
        """
        import ray

        from pipelines.control.plan import explore_dataset

        repeats = runs_per_task(
            self.config.buffer.explorer_input.taskset.repeat_times,
            self.config.explorer.max_repeat_times_per_runner,
        )
        staleness = StalenessBound(self.config.synchronizer.max_staleness, self._reference_version)
        committer = StepCommitter(
            self.plan, self.sink, first_step=first, rows_per_task=repeats, staleness=staleness
        )
        if committer.done:
            return
        gate = self.gate_name
        dataset = explore_dataset(self.config, self.plan, self.engines.names, self.sink.root, gate, first)
        drained = drain_in_background(dataset)
        while not committer.done:
            if self.supervisor.error is not None:
                raise self.supervisor.error
            finished = drained.done()  # read before collecting, so reports sent before the end are seen
            for records in ray.get(self.gate.collect.remote(0.5)):
                self.bar.update(
                    pc.sum(pc.equal(records.column("run_id_base"), 0)).as_py() or 0
                )  # tasks, not sub-runs
                yield from committer.add(records)
            if finished and not committer.done:
                drained.result()  # the stream's own error, if it failed
                raise RuntimeError(f"the stream ended before step {committer.next_step} was complete")

    def _log_step(self, done: CommittedStep) -> None:
        metrics = step_metrics(
            done.experiences, done.records, done.seconds, done.reference_version, done.dropped_stale
        )
        metrics["engine/restarts"] = float(self.supervisor.total_restarts)
        if done.dropped_stale:
            self._say(
                f"step {done.step}: dropped {done.dropped_stale} experiences more than "
                f"{self.config.synchronizer.max_staleness} versions behind version {done.reference_version}"
            )
        self.monitor.log_metrics(metrics, done.step)
        limit = self.config.monitor.sample_rollouts
        if limit and len(done.experiences):
            self.monitor.log_table(
                sample_table(done.experiences, limit), f"samples/step_{done.step:06d}.json"
            )
        if metrics["rollout/failed_tasks"]:
            self.monitor.log_table(failure_table(done.records), f"failures/step_{done.step:06d}.json")
        totals = self.totals
        totals["experiences"] += len(done.experiences)
        totals["rewards"] += pc.sum(done.experiences.column("reward")).as_py() or 0.0
        totals["tokens"] += pc.sum(pc.list_value_length(done.experiences.column("response_ids"))).as_py() or 0
        totals["failed"] += int(metrics["rollout/failed_tasks"])
        if "rollout/reward/mean" in metrics:
            self.step_rewards[done.step] = metrics["rollout/reward/mean"]
        for message in failure_messages(done.records):
            self._say(f"step {done.step}: task failed: {message}")
        self.bar.set_postfix(
            step=f"{done.step}/{self.plan.num_steps}",
            tok_s=f"{totals['tokens'] / max(time.monotonic() - self.started, 1e-9):.0f}",
            reward=f"{metrics.get('rollout/reward/mean', float('nan')):.2f}",
        )

    def _say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()


def base_tensor_meta(model_path: Path) -> TensorMetaMap:
    """The base model's tensors: what every synced version must match."""
    try:
        return tensor_meta(model_path)
    except CheckpointError as exc:
        raise InputError(str(exc), file=str(model_path), field="model.model_path") from None


def check_workflows(cfg: Config) -> None:
    """Load plugins and check every workflow and reward name before any engine starts."""
    from operators.rollout.plugins import load_plugins
    from operators.rollout.rewards import get_reward_fn
    from operators.workflows.registry import load_builtins, workflow_class

    load_builtins()
    for plugin_dir in cfg.plugin_dirs:
        load_plugins(plugin_dir)
    explorer_input = cfg.buffer.explorer_input
    tasksets = [(explorer_input.taskset, False)] + [(ts, True) for ts in explorer_input.eval_tasksets]
    for taskset, is_eval in tasksets:
        where = f"taskset '{taskset.name}'"
        try:
            workflow_class(explorer_input.workflow_for(taskset, is_eval))
            if taskset.default_reward_fn_type:
                get_reward_fn(taskset.default_reward_fn_type)
        except KeyError as exc:
            raise InputError(
                f"{where}: {exc.args[0]}", field="default_workflow_type / default_reward_fn_type"
            ) from None


def drain_in_background(dataset: Any) -> Future:
    """Iterate the dataset in a daemon thread: a stream a failed run leaves behind never holds up the exit."""
    drained: Future = Future()

    def drain() -> None:
        try:
            for _ in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
                pass
            drained.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the committing loop, which raises it
            drained.set_exception(exc)

    threading.Thread(target=drain, name="rftflow-drain", daemon=True).start()
    return drained


def failure_messages(records: pa.Table, limit: int = 3) -> list[str]:
    """A few failed tasks' messages, so a failing workflow is visible while the run goes on."""
    failed = records.filter(pc.invert(records.column("ok")))
    rows = failed.select(["task_uid", "message"]).slice(0, limit).to_pylist()
    more = len(failed) - len(rows)
    return [f"{r['task_uid']}: {r['message']}" for r in rows] + ([f"... and {more} more"] if more > 0 else [])
