"""The control stage on the driver: gathers per-task records and commits steps in order, each exactly once."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from operators.parquet_sink import ParquetSink
from operators.taskset_reader import TasksetPlan


@dataclass
class CommittedStep:
    step: int
    experiences: pa.Table
    records: pa.Table
    seconds: float


class StepCommitter:
    """A step commits when every one of its tasks has reported (ok or failed) and all earlier steps have."""

    def __init__(
        self,
        plan: TasksetPlan,
        sink: ParquetSink,
        clock: Callable[[], float] = time.monotonic,
        first_step: int = 1,
    ):
        self.plan, self.sink, self.clock = plan, sink, clock
        self.records: dict[int, list[pa.Table]] = defaultdict(list)
        self.seen: dict[int, set[str]] = defaultdict(set)
        self.next_step = first_step
        self.last_commit = clock()

    @property
    def done(self) -> bool:
        return self.next_step > self.plan.num_steps

    def add(self, records: pa.Table) -> list[CommittedStep]:
        steps = records.column("step")
        for step in pc.unique(steps).to_pylist():
            part = records.filter(pc.equal(steps, step))
            uids = set(part.column("task_uid").to_pylist())
            if len(uids) != len(part) or uids & self.seen[step] or step < self.next_step:
                raise RuntimeError(f"step {step}: a task reported twice")
            self.seen[step] |= uids
            self.records[step].append(part)
        committed = []
        while not self.done and len(self.seen[self.next_step]) >= self.plan.tasks_in_step(self.next_step):
            committed.append(self._commit(self.next_step))
            self.next_step += 1
        return committed

    def _commit(self, step: int) -> CommittedStep:
        records = pa.concat_tables(self.records.pop(step))
        del self.seen[step]
        fragments = {f for f in records.column("fragment").to_pylist() if f}
        self.sink.commit_step(step, fragments)
        now = self.clock()
        seconds, self.last_commit = now - self.last_commit, now
        return CommittedStep(step, self.sink.read_step(step), records, seconds)
