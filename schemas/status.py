"""Status of one sub-run's attempt group, and the result row the rollout operator emits for it.

A task's repeats may be split into sub-runs (`run_id_base`, `repeat_times`); every dispatched sub-run yields
exactly one result row, ok or not, so a failed one is counted, never dropped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from schemas.experience import EXPERIENCE_SCHEMA, Experience


@dataclass
class Status:
    ok: bool
    metric: dict[str, float] = field(default_factory=dict)
    message: str | None = None
    attempts: int = 1
    runner: str = ""


# What the experience ops dropped of one sub-run's experiences: op name -> how many.
FILTERED_TYPE = pa.map_(pa.string(), pa.int64())

RESULT_SCHEMA = pa.schema(
    [
        ("task_uid", pa.string()),
        ("taskset", pa.string()),
        ("step", pa.int64()),
        ("is_eval", pa.bool_()),
        ("run_id_base", pa.int32()),
        ("repeat_times", pa.int32()),
        ("ok", pa.bool_()),
        ("metric", pa.string()),
        ("message", pa.string()),
        ("attempts", pa.int32()),
        ("runner", pa.string()),
        ("task_run_time", pa.float64()),
        ("finished_at", pa.float64()),  # wall clock (time.time()) when the row was made: the step's tail
        ("experiences", pa.list_(pa.struct(list(EXPERIENCE_SCHEMA)))),
    ]
)


def result_row(
    *,
    task_uid: str,
    taskset: str,
    step: int,
    is_eval: bool,
    run_id_base: int,
    repeat_times: int,
    status: Status,
    task_run_time: float,
    experiences: list[Experience],
) -> dict[str, Any]:
    """One sub-run's row; its metric always includes `task_run_time`, ok or not."""
    metric = {**status.metric, "task_run_time": task_run_time}
    return {
        "task_uid": task_uid,
        "taskset": taskset,
        "step": step,
        "is_eval": is_eval,
        "run_id_base": run_id_base,
        "repeat_times": repeat_times,
        "ok": status.ok,
        "metric": json.dumps(metric, sort_keys=True),
        "message": status.message,
        "attempts": status.attempts,
        "runner": status.runner,
        "task_run_time": task_run_time,
        "finished_at": time.time(),
        "experiences": [e.to_row() for e in experiences],
    }


def results_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def flatten_experiences(results: pa.Table) -> pa.Table:
    """The Experience rows inside a result table, as a flat table ready for a sink."""
    column = results.column("experiences").combine_chunks()
    flat = column.flatten() if len(column) else pa.array([], type=column.type.value_type)
    if isinstance(flat, pa.ChunkedArray):
        flat = flat.combine_chunks()
    return pa.Table.from_struct_array(flat).cast(EXPERIENCE_SCHEMA)
