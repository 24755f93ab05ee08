"""The rollout operator: a Ray Data async actor pool that forwards each Task row to an engine actor.

With a sink root, it is also the sink's writing stage: each finished batch's experiences go through the
experience ops (`operators.ops.stage`: a batch holds whole tasks), are written as pending fragments at once,
and the batch's records are reported through the step gate to the driver.

Pool actors hold only engine handles (looked up by name) and idle resettable workflows; state worth keeping
lives in engines and the driver. A batch's sub-runs run concurrently, spread over the engines in turn; past
`batch_timeout` the unfinished ones are cancelled and reported as failed rows, so the step still completes;
with over-rollout, those left once most are done are cancelled and reported as skipped, or with
`recycle` they go on: the step reports them as deferred at once, and they report with the next step.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from operators.actors.gate import GateClient
from operators.actors.names import NAMESPACE
from operators.engine.client import EngineClient
from operators.ops.stage import ExperienceOps
from operators.rollout.over_rollout import DEFERRED, SKIPPED, OverRollout
from operators.rollout.plugins import load_plugins
from operators.rollout.reward_registry import warm_up_rewards
from operators.rollout.runner import SubRun, WorkflowRunner, dynamic_runner_timeout, split_task
from operators.sinks.parquet import write_fragments
from schemas.config import Config
from schemas.rollout_policy import DynamicTimeoutConfig, OverRolloutConfig
from schemas.status import results_to_table
from schemas.task import Task, tasks_from_table

Carried = tuple[asyncio.Future, SubRun, EngineClient]  # a run over-rollout cut that goes on, to a later step


@dataclass(frozen=True)
class RolloutStage:
    """The rollout stage as a value: what every forwarding actor of the pool is built from. Ray Data makes
    the actors itself, from `RolloutOperator` and this one argument; `from_config` is the one place that
    reads it from the run's config, so a new setting is a field here and its use in `RolloutOperator`."""

    engine_names: tuple[str, ...]
    max_timeout: float
    max_retry_times: int
    plugin_dirs: tuple[str, ...] = ()
    max_repeat_times_per_runner: int | None = None
    batch_timeout: float | None = None
    gate_name: str | None = None  # training steps: batches wait for their step and report through the gate
    sink_root: str | None = None
    restart_timeout: float = 600.0
    over_rollout: OverRolloutConfig | None = None
    dynamic_timeout: DynamicTimeoutConfig | None = None
    experience_ops: tuple[dict[str, Any], ...] = ()
    last_step: int | None = None  # the run's last training step: no later step to move recycled tasks to

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        engine_names: list[str],
        gate_name: str | None = None,
        sink_root: Path | None = None,
        experience_ops: list[dict[str, Any]] = (),
        last_step: int | None = None,
    ) -> RolloutStage:
        """The stage of a run's training steps (with the gate) or of an eval taskset (without)."""
        explorer = cfg.explorer
        return cls(
            engine_names=tuple(engine_names),
            max_timeout=explorer.max_timeout,
            max_retry_times=explorer.max_retry_times,
            plugin_dirs=tuple(str(p) for p in cfg.plugin_dirs),
            max_repeat_times_per_runner=explorer.max_repeat_times_per_runner,
            batch_timeout=explorer.batch_timeout,
            gate_name=gate_name,
            sink_root=None if sink_root is None else str(sink_root),
            restart_timeout=explorer.engine_restart_timeout,
            over_rollout=explorer.over_rollout if gate_name is not None else None,  # training steps only
            dynamic_timeout=explorer.dynamic_timeout,
            experience_ops=tuple(experience_ops),
            last_step=last_step,
        )


class RolloutOperator:
    """`map_batches` callable: Task table in, result table (status + experiences per sub-run) out."""

    def __init__(self, stage: RolloutStage):
        """One forwarding actor of the pool, built by Ray Data from the stage (`RolloutStage`)."""
        import ray  # heavy, deferred: the driver imports this module (to build the pool) without Ray

        for plugin_dir in stage.plugin_dirs:  # users' workflows must be registered in this worker too
            load_plugins(Path(plugin_dir))
        warm_up_rewards()  # while the engines load, not in the first step
        clients = [EngineClient.named(name, stage.restart_timeout) for name in stage.engine_names]
        dynamic = dynamic_runner_timeout(stage.dynamic_timeout)
        runner = WorkflowRunner(stage.max_timeout, stage.max_retry_times, dynamic=dynamic)
        self._setup(
            clients, runner, stage.max_repeat_times_per_runner, stage.batch_timeout, stage.over_rollout
        )
        if stage.gate_name is not None:
            gate = ray.get_actor(stage.gate_name, namespace=NAMESPACE)
            context = ray.get_runtime_context()  # enlisted: the gate's owner ends this actor at shutdown
            ray.get(gate.enlist.remote(context.get_actor_id(), context.current_actor))
            self.gate = GateClient(gate)
        self.sink_root = stage.sink_root
        ops = stage.experience_ops
        self.ops = ExperienceOps(list(ops)) if ops else None  # after the plugins
        self.last_step = stage.last_step

    @classmethod
    def from_clients(
        cls,
        clients: list[EngineClient],
        *,
        max_timeout: float,
        max_retry_times: int,
        max_repeat_times_per_runner: int | None = None,
        batch_timeout: float | None = None,
        over_rollout: OverRolloutConfig | None = None,
        dynamic_timeout: DynamicTimeoutConfig | None = None,
    ) -> RolloutOperator:
        """An operator over given clients (e.g. in-process engines), without Ray."""
        operator = cls.__new__(cls)
        runner = WorkflowRunner(max_timeout, max_retry_times, dynamic=dynamic_runner_timeout(dynamic_timeout))
        operator._setup(clients, runner, max_repeat_times_per_runner, batch_timeout, over_rollout)
        return operator

    def _setup(
        self,
        clients: list[EngineClient],
        runner: WorkflowRunner,
        max_repeat_times_per_runner: int | None,
        batch_timeout: float | None,
        over_rollout: OverRolloutConfig | None,
    ) -> None:
        if not clients:
            raise ValueError("the rollout operator needs at least one engine")
        self.clients = clients
        self.turn = itertools.cycle(clients)
        self.runner = runner
        self.max_repeat_times_per_runner = max_repeat_times_per_runner
        self.batch_timeout = batch_timeout
        cut = over_rollout or OverRolloutConfig()
        self.over_rollout = OverRollout(cut.ratio, cut.wait_after_min, cut.recycle)
        self.last_step: int | None = None
        self.gate: GateClient | None = None
        self.sink_root: str | None = None
        self.ops: ExperienceOps | None = None

    async def __call__(self, batch: pa.Table) -> pa.Table:
        """Each step's tasks of the batch run as soon as that step is released, and finish on their own.

        Ray Data cuts batches without regard to steps, so one batch may hold the end of a released step and
        the start of a gated one; the released part must land, and report, without waiting for the rest.
        """
        by_step: dict[int, list[Task]] = {}
        for task in tasks_from_table(batch):
            by_step.setdefault(task.step, []).append(task)
        if not by_step:
            return self._finish(results_to_table([]))
        parts = await asyncio.gather(*(self._run_step(step, tasks) for step, tasks in by_step.items()))
        return pa.concat_tables(parts)

    async def _run_step(self, step: int, tasks: list[Task]) -> pa.Table:
        if self.gate is not None:  # before the batch clock starts: waiting for a sync is not slowness
            await self.gate.admit(step)
        split = self.max_repeat_times_per_runner
        subs = [sub for task in tasks for sub in split_task(task, split)]
        carry = self.over_rollout.recycle and self.last_step is not None and step < self.last_step
        rows, carried = await self._run_all(subs, carry)
        records = await self._report(self._finish(results_to_table(rows)))
        if not carried:
            return records
        later = await self._report(
            self._finish(results_to_table(await self._finish_carried(carried, step + 1)))
        )
        return pa.concat_tables([records, later])

    def _finish(self, results: pa.Table) -> pa.Table:
        """With a sink, the results' experiences, through the ops, land now as pending fragments; the records
        go on. `results` is one step's whole tasks (`_run_step`), so every op sees each task's whole group."""
        if self.sink_root is None:
            return results
        if self.ops is not None:
            results = self.ops.apply_to_results(results)
        return write_fragments(results, self.sink_root)

    async def _report(self, records: pa.Table) -> pa.Table:
        if self.sink_root is not None and self.gate is not None:
            await self.gate.report(records)
        return records

    async def run_all(self, subs: list[SubRun]) -> list[dict[str, Any]]:
        """A row per sub-run, in order; those still running at the batch timeout are cancelled and failed."""
        return (await self._run_all(subs, carry=False))[0]

    async def _run_all(self, subs: list[SubRun], carry: bool) -> tuple[list[dict[str, Any]], list[Carried]]:
        """The rows of the step, and with `carry` the runs over-rollout cut, still going (`Carried`).

        A task is carried whole: its sub-runs that are done move with it, so an op sees its whole group.
        """
        if not subs:
            return [], []
        engines = [next(self.turn) for _ in subs]
        runs = [asyncio.ensure_future(self.runner.run(s, e)) for s, e in zip(subs, engines, strict=True)]
        cut, carried = False, []
        try:
            cut = await self.over_rollout.wait(runs, self.batch_timeout)
            if cut and carry:
                moving = {sub.task.task_uid for run, sub in zip(runs, subs, strict=True) if not run.done()}
                carried = [c for c in zip(runs, subs, engines, strict=True) if c[1].task.task_uid in moving]
        finally:  # past the deadline, cut by over-rollout, or this call itself cancelled: nothing may go on
            going = {id(run) for run, _, _ in carried}
            await cancel([run for run in runs if id(run) not in going])
        moved = {sub.task.task_uid for _, sub, _ in carried}
        rows = [
            sub.failed_row(engine.name, f"{DEFERRED} to step {sub.task.step + 1}")
            if sub.task.task_uid in moved
            else self.cancelled_row(sub, engine, cut)
            if run.cancelled()
            else run.result()
            for run, sub, engine in zip(runs, subs, engines, strict=True)
        ]
        return rows, carried

    async def _finish_carried(self, carried: list[Carried], step: int) -> list[dict[str, Any]]:
        """The carried runs' rows once done (or cancelled at the batch timeout), relabelled to `step`."""
        runs = [run for run, _, _ in carried]
        try:
            if not all(run.done() for run in runs):
                await asyncio.wait([r for r in runs if not r.done()], timeout=self.batch_timeout)
        finally:
            await cancel(runs)
        rows = [
            self.cancelled_row(sub, engine, False) if run.cancelled() else run.result()
            for run, sub, engine in carried
        ]
        return [moved_to(row, step) for row in rows]

    def cancelled_row(self, sub: SubRun, engine: EngineClient, cut: bool) -> dict[str, Any]:
        if cut:
            return sub.failed_row(engine.name, f"{SKIPPED} (ratio {self.over_rollout.ratio:g})")
        return sub.failed_row(engine.name, f"cancelled: batch timeout after {self.batch_timeout:g}s")


def moved_to(row: dict[str, Any], step: int) -> dict[str, Any]:
    """A result row, and its experiences, relabelled to the later step they commit in."""
    return {**row, "step": step, "experiences": [{**e, "step": step} for e in row["experiences"]]}


async def cancel(runs: list[asyncio.Future]) -> None:
    """Cancel the unfinished runs and wait until they have stopped (their engine requests aborted)."""
    pending = [run for run in runs if not run.done()]
    for run in pending:
        run.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
