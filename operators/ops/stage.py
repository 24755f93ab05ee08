"""The experience-ops stage: the configured chain, run on one rollout batch's step before it is written.

Why here: a task is one row of the taskset stream, and its sub-runs (`max_repeat_times_per_runner`) are all
dispatched and awaited by the same rollout call, which reports them in one record batch. So a batch's table
holds every finished sample of each of its tasks, whichever runner made them: the ops see whole groups with
no shuffle, and what they drop never reaches a fragment.

What each op drops is counted per sub-run record (`filtered`, op name -> experiences), so the counts travel
with the records and are committed, or dropped as a retried batch's repeat, exactly as the records are.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from operators.ops.registry import ExperienceOp, build_op
from schemas.experience import EXPERIENCE_SCHEMA, KEY
from schemas.status import FILTERED_TYPE, flatten_experiences

Key = tuple[str, int, int]


class ExperienceOpError(RuntimeError):
    """An op broke the stage's contract (added or duplicated rows, changed keys, lost columns) or raised."""


def row_keys(experiences: pa.Table) -> list[Key]:
    columns = [experiences.column(name).to_pylist() for name in KEY]
    return list(zip(*columns, strict=True))


class ExperienceOps:
    """The chain of `buffer.explorer_input.experience_ops`, built once per rollout actor."""

    def __init__(self, configs: list[dict[str, Any]]):
        """`configs`: `{"name": ..., "args": {...}}` per op, in order (`ExperienceOpConfig.model_dump()`)."""
        self.chain: list[tuple[str, ExperienceOp]] = [
            (config["name"], build_op(config["name"], config.get("args") or {})) for config in configs
        ]

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(name for name, _ in self.chain))

    def apply(self, experiences: pa.Table) -> tuple[pa.Table, dict[str, list[Key]]]:
        """The rows every op kept, and the keys each op dropped."""
        dropped: dict[str, list[Key]] = {name: [] for name in self.names}
        for position, (name, op) in enumerate(self.chain):
            where = f"experience op '{name}' (experience_ops.{position})"
            before = row_keys(experiences)
            try:
                out = op(experiences)
            except Exception as exc:
                raise ExperienceOpError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
            experiences = conform(out, where)
            after = row_keys(experiences)
            twice = [k for k, n in Counter(after).items() if n > 1]
            added = set(after) - set(before)
            if twice or added:
                raise ExperienceOpError(
                    f"{where} returned a row it was not given, or one twice ({sorted(added or twice)[0]}): "
                    "an op may change values and drop rows, never add rows or change their keys"
                )
            kept = set(after)
            dropped[name] += [k for k in before if k not in kept]
        return experiences, dropped

    def apply_to_results(self, results: pa.Table) -> pa.Table:
        """A result table (one row per sub-run) whose experiences went through the chain, plus a `filtered`
        column counting, per sub-run, what each op dropped of its experiences (0 for an op that dropped none).
        """
        counts = pc.list_value_length(results.column("experiences")).fill_null(0)
        parent_of_row = np.repeat(np.arange(len(results)), counts.to_numpy(zero_copy_only=False))
        flat = flatten_experiences(results)
        parent = dict(zip(row_keys(flat), parent_of_row.tolist(), strict=True))
        kept, dropped = self.apply(flat)
        filtered = [dict.fromkeys(self.names, 0) for _ in range(len(results))]
        for name, keys in dropped.items():
            for key in keys:
                filtered[parent[key]][name] += 1
        index = results.schema.get_field_index("experiences")
        field = results.schema.field(index)
        parents = np.array([parent[k] for k in row_keys(kept)], int)
        results = results.set_column(index, field, regroup(kept, parents, len(results), field.type))
        return results.append_column("filtered", pa.array([list(f.items()) for f in filtered], FILTERED_TYPE))


def conform(table: Any, where: str) -> pa.Table:
    """An op's output as `EXPERIENCE_SCHEMA`, or an error naming the op."""
    if not isinstance(table, pa.Table):
        raise ExperienceOpError(f"{where} returned {type(table).__name__}, not a pyarrow Table")
    missing = [name for name in EXPERIENCE_SCHEMA.names if name not in table.column_names]
    if missing:
        raise ExperienceOpError(f"{where} returned a table without columns {missing}")
    try:
        return table.select(EXPERIENCE_SCHEMA.names).cast(EXPERIENCE_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ExperienceOpError(f"{where} returned columns of the wrong type: {exc}") from None


def regroup(experiences: pa.Table, parent: np.ndarray, num_results: int, list_type: pa.DataType) -> pa.Array:
    """The result rows' `experiences` lists again: each kept row back under its sub-run, in the order kept."""
    rows = experiences.take(pa.array(np.argsort(parent, kind="stable"), pa.int64()))
    columns = [rows.column(name).combine_chunks() for name in rows.column_names]
    values = pa.StructArray.from_arrays(columns, fields=list(rows.schema))
    offsets = np.concatenate([[0], np.cumsum(np.bincount(parent, minlength=num_results))])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values).cast(list_type)
