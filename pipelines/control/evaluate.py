"""One eval taskset, run whole on the fleet's current weights: used by periodic eval and the bench alike.

Both measure "this version on this taskset": the explorer at its eval steps, the bench once per checkpoint.
They differ only in where the experiences go and which metrics they compute from them, so the running
itself is here, once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from operators.tasks.reader import TasksetPlan
from pipelines.control.fleet import Fleet
from pipelines.control.plan import eval_dataset
from schemas.atomic import atomic_open
from schemas.config import Config, TasksetConfig
from schemas.experience import EXPERIENCE_SCHEMA
from schemas.status import flatten_experiences
from schemas.storage import Location, is_remote


@dataclass
class Evaluation:
    """A taskset's eval: its experiences (none for failed tasks), per-task records, and how long it took."""

    taskset: TasksetConfig
    experiences: pa.Table
    records: pa.Table | None
    seconds: float

    @property
    def failed_tasks(self) -> int:
        if self.records is None:
            return 0
        return len(self.records) - (pc.sum(self.records.column("ok")).as_py() or 0)

    def first_failure(self) -> str:
        """One failed task's message, to say why an eval gave nothing."""
        if self.records is None:
            return "no results"
        failed = self.records.filter(pc.invert(self.records.column("ok")))
        return str(failed.column("message").to_pylist()[:1])


def evaluate(
    cfg: Config,
    fleet: Fleet,
    taskset: TasksetConfig,
    plan: TasksetPlan,
    step: int,
    out: Location | None = None,
) -> Evaluation:
    """Every task of `taskset` through the fleet's engines, labelled `step`; experiences written to `out`."""
    started = time.monotonic()
    dataset = eval_dataset(cfg, taskset, plan, fleet.names, step)
    batches = list(dataset.iter_batches(batch_format="pyarrow", batch_size=None))
    seconds = time.monotonic() - started
    records = pa.concat_tables(batches) if batches else None
    experiences = flatten_experiences(records) if records is not None else EXPERIENCE_SCHEMA.empty_table()
    if out is not None and len(experiences):
        if not is_remote(out):  # an object store has no folders to make
            Path(out).parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(out) as f:
            pq.write_table(experiences, f)
    return Evaluation(taskset, experiences, records, seconds)
