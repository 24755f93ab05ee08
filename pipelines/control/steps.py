"""The control stage on the driver: gathers per-sub-run records and commits steps in order, each exactly once.

A task whose repeats are split reports one record per sub-run, keyed `(task_uid, run_id_base)`. A task that
over-rollout moved to the next step (`recycle`) reports twice: deferred in its own step, which commits without
it, and again with the next step, which waits for it: the deferred records say how many to wait for.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from operators.rollout.over_rollout import DEFERRED
from operators.sinks.base import Sink
from operators.tasks.reader import TasksetPlan
from pipelines.control.metrics import ended_early


@dataclass
class CommittedStep:
    step: int
    experiences: pa.Table
    records: pa.Table
    seconds: float
    reference_version: int = 0  # the trainer's newest version when the step committed
    dropped_stale: int = 0


@dataclass
class StalenessBound:
    """Experiences more than `max_versions` behind `reference()` (the trainer's newest version) are dropped.

    Staleness is read when a step commits, the first moment a trainer can consume it.
    """

    max_versions: int | None
    reference: Callable[[], int]


def sub_run_keys(records: pa.Table) -> list[tuple[str, int]]:
    """`(task_uid, run_id_base)` per record: what identifies one sub-run's report."""
    rows = records.select(["task_uid", "run_id_base"]).to_pylist()
    return [(row["task_uid"], row["run_id_base"]) for row in rows]


def committed_task_uids(sink: Sink) -> set[str]:
    """The task uids of every committed step: what a resumed run's committer must never write again."""
    return {
        uid for step in sink.committed_steps() for uid in sink.read_step(step).column("task_uid").to_pylist()
    }


def deferred_uids(records: pa.Table) -> list[str]:
    """The task uid of each record (sub-run) over-rollout moved on to the next step."""
    return records.filter(ended_early(records, DEFERRED)).column("task_uid").to_pylist()


class StepCommitter:
    """A step commits when every sub-run of its tasks has reported (ok or failed) and all earlier steps have.

    `rows_per_task` is how many records each task yields: its sub-runs, as
    `operators.rollout.runner.runs_per_task(repeat_times, max_repeat_times_per_runner)` counts them.
    """

    def __init__(
        self,
        plan: TasksetPlan,
        sink: Sink,
        clock: Callable[[], float] = time.monotonic,
        first_step: int = 1,
        rows_per_task: int = 1,
        staleness: StalenessBound | None = None,
        committed_uids: set[str] | None = None,
        on_deferred: Callable[[int, list[str]], None] | None = None,
    ):
        """`committed_uids`: the task uids of steps committed before this committer (a resumed run's).
        `on_deferred(step, task_uids)`: told, before a step commits, which of its tasks go on into the next
        (so a crash that loses them can be told on resume)."""
        if rows_per_task < 1:
            raise ValueError(f"rows_per_task must be >= 1, got {rows_per_task}")
        self.plan, self.sink, self.clock = plan, sink, clock
        self.rows_per_task = rows_per_task
        self.staleness = staleness or StalenessBound(None, lambda: 0)
        self.records: dict[int, list[pa.Table]] = defaultdict(list)
        self.seen: dict[int, set[tuple[str, int]]] = defaultdict(set)
        self.next_step = first_step
        self.repeats = 0  # sub-run reports dropped as repeats of earlier ones
        self.last_commit = clock()
        self.committed_uids = set(committed_uids or ())
        self.carried_in: dict[int, int] = defaultdict(int)  # step -> sub-runs moved into it (recycled)
        self.on_deferred = on_deferred

    @property
    def done(self) -> bool:
        return self.next_step > self.plan.num_steps

    def rows_in_step(self, step: int) -> int:
        return self.plan.tasks_in_step(step) * self.rows_per_task + self.carried_in.get(step, 0)

    def add(self, records: pa.Table) -> Iterator[CommittedStep]:
        """Take a report's records at once; the steps they complete commit one by one as the result is
        iterated, so a caller logs each before the next commits (a crash leaves at most one unlogged)."""
        records = self._drop_repeats(records)
        steps = records.column("step")
        for step in pc.unique(steps).to_pylist():
            part = records.filter(pc.equal(steps, step))
            self.seen[step] |= set(sub_run_keys(part))
            self.records[step].append(part)
            self.carried_in[step + 1] += len(deferred_uids(part))
        return self._commit_ready()

    def _commit_ready(self) -> Iterator[CommittedStep]:
        while not self.done and len(self.seen[self.next_step]) >= self.rows_in_step(self.next_step):
            done = self._commit(self.next_step)
            self.next_step += 1
            yield done

    def _drop_repeats(self, records: pa.Table) -> pa.Table:
        """Records of sub-runs already reported (a retried batch reports again) are dropped and counted.

        The first report wins; a repeat's fragments are named by no kept record, so its commit removes them.
        The same key twice within one report is a bug, not a retry.
        """
        keys = sub_run_keys(records)
        twice = sorted(k for k, n in Counter(keys).items() if n > 1)
        if twice:
            raise RuntimeError(f"a task reported twice in one batch (task_uid, run_id_base): {twice}")
        steps = records.column("step").to_pylist()
        keep = [
            step >= self.next_step and key not in self.seen.get(step, ())
            for key, step in zip(keys, steps, strict=True)
        ]
        self.repeats += keep.count(False)
        return records if all(keep) else records.filter(pa.array(keep, pa.bool_()))

    def _refuse_duplicates(self, step: int, records: pa.Table) -> None:
        """A task of this step already committed in an earlier one would be written twice: that is a bug in
        rftflow (a resume checks its config first), so nothing is written and the run stops saying so."""
        uids = set(records.filter(records.column("ok")).column("task_uid").to_pylist())
        again = sorted(uids & self.committed_uids)
        if again:
            raise RuntimeError(
                f"step {step} holds tasks already committed in an earlier step ({again[:3]}, {len(again)} in "
                "all); nothing of it was written. This is a bug in rftflow: please report it with the run's "
                "config.yaml"
            )
        self.committed_uids |= uids

    def _commit(self, step: int) -> CommittedStep:
        records = pa.concat_tables(self.records.pop(step))
        del self.seen[step]
        self.carried_in.pop(step, None)
        if self.on_deferred is not None:
            self.on_deferred(step, sorted(set(deferred_uids(records))))
        fragments = {f for f in records.column("fragment").to_pylist() if f}
        self._refuse_duplicates(step, records)
        reference = self.staleness.reference()
        bound = self.staleness.max_versions
        dropped = self.sink.commit_step(step, fragments, None if bound is None else reference - bound)
        now = self.clock()
        seconds, self.last_commit = now - self.last_commit, now
        return CommittedStep(step, self.sink.read_step(step), records, seconds, reference, dropped)
