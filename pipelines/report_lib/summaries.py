"""Per-step statistics and rollout rows from experience tables: pure functions of `pa.Table`s, so the
numbers behind every figure are tested without a run, a plot or MLflow.

MLflow holds each step's mean, min and max; the spread (standard deviation, 10th-90th percentile) and the
distributions need the experiences themselves, which is why the plots read these rather than the metrics.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SPREAD = (10, 90)  # percentiles of the shaded band: robust to the one outlier a small step may hold
ROLLOUT_COLUMNS = (
    "step",
    "uid",
    "taskset",
    "model_version",
    "prompt_text",
    "response_text",
    "truth",
    "reward",
    "reward_parts",
    "finish_reason",
    "segment",
    "turns",
    "response_ids",
    "action_mask",
    "inserted_spans",
)


@dataclass
class StepStats:
    """One value's distribution at each step: the columns of a curve with its spread."""

    steps: list[int] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)  # SPREAD[0] percentile
    high: list[float] = field(default_factory=list)  # SPREAD[1] percentile
    minimum: list[float] = field(default_factory=list)
    maximum: list[float] = field(default_factory=list)
    count: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.steps)


def values_by_step(
    steps: pa.Array | Sequence[int], values: pa.Array | Sequence[Any]
) -> dict[int, list[float]]:
    """The non-null values at each step, steps ascending."""
    steps = steps.to_pylist() if isinstance(steps, pa.Array | pa.ChunkedArray) else list(steps)
    values = values.to_pylist() if isinstance(values, pa.Array | pa.ChunkedArray) else list(values)
    grouped: dict[int, list[float]] = {}
    for step, value in zip(steps, values, strict=True):
        if value is not None and step is not None:
            grouped.setdefault(int(step), []).append(float(value))
    return dict(sorted(grouped.items()))


def step_stats(steps: pa.Array | Sequence[int], values: pa.Array | Sequence[Any]) -> StepStats:
    """Mean, standard deviation, percentile band, min and max of `values` at each step (nulls left out)."""
    stats = StepStats()
    for step, found in values_by_step(steps, values).items():
        array = np.asarray(found, dtype=float)
        low, high = np.percentile(array, SPREAD)
        stats.steps.append(step)
        stats.mean.append(float(array.mean()))
        stats.std.append(float(array.std()))
        stats.low.append(float(low))
        stats.high.append(float(high))
        stats.minimum.append(float(array.min()))
        stats.maximum.append(float(array.max()))
        stats.count.append(len(found))
    return stats


def reward_parts(table: pa.Table) -> dict[str, pa.Array]:
    """Each part of the reward (`accuracy`, `format`, ...) as a column aligned with the rows, null where a
    row lacks that part; parts by name."""
    parts = table.column("reward_parts").combine_chunks()
    if not len(parts):
        return {}
    names = sorted(n for n in pc.unique(parts.keys).to_pylist() if n is not None)
    return {name: pc.list_element(pc.map_lookup(parts, name, "all"), 0) for name in names}


def reward_series(table: pa.Table) -> dict[str, StepStats]:
    """`reward` and each of its parts against step: the curves of the reward figure."""
    steps = table.column("step")
    curves = {"reward": step_stats(steps, table.column("reward"))}
    for name, values in reward_parts(table).items():
        curves[name] = step_stats(steps, values)
    return curves


def response_lengths(table: pa.Table) -> pa.Array:
    """Response tokens per experience (inserted tokens of a multi-turn response included)."""
    return pc.list_value_length(table.column("response_ids"))


def sampled_lengths(table: pa.Table) -> list[int]:
    """Tokens the model sampled per experience (`action_mask` true): a multi-turn response's own length."""
    masks = table.column("action_mask").to_pylist()
    responses = table.column("response_ids").to_pylist()
    return [
        len(ids or ()) if mask is None else sum(bool(m) for m in mask)
        for mask, ids in zip(masks, responses, strict=True)
    ]


def is_multi_turn(table: pa.Table) -> bool:
    """Whether any experience holds more than one engine call or an inserted span."""
    if not len(table):
        return False
    turns = pc.max(table.column("turns")).as_py() or 1
    spans = pc.max(pc.list_value_length(table.column("inserted_spans"))).as_py() or 0
    return turns > 1 or spans > 0


def rollout_rows(table: pa.Table, limit: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """A browsable sample: up to `limit` experiences spread evenly over the steps (a fixed seed, so a
    report drawn twice shows the same rows), in (step, uid) order, with the columns the browser shows."""
    if not len(table) or limit <= 0:
        return []
    by_step: dict[int, list[int]] = {}
    for index, step in enumerate(table.column("step").to_pylist()):
        by_step.setdefault(int(step), []).append(index)
    rng = random.Random(seed)
    per_step = max(1, limit // len(by_step))
    chosen = []
    for indices in by_step.values():
        chosen += sorted(rng.sample(indices, min(per_step, len(indices))))
    chosen = chosen[:limit]
    columns = [c for c in ROLLOUT_COLUMNS if c in table.column_names]
    rows = table.take(pa.array(chosen, pa.int64())).select(columns).to_pylist()
    for row in rows:
        if row.get("reward_parts") is not None:
            row["reward_parts"] = dict(row["reward_parts"])
    return sorted(rows, key=lambda row: (row["step"], row["uid"]))


def response_pieces(
    response_ids: Sequence[int], inserted_spans: Sequence[Sequence[int]] | None
) -> list[tuple[bool, list[int]]]:
    """The response cut at its inserted spans: `(inserted, token ids)` in order, so a browser can show the
    tokens the model did not sample (tool output, observations, template) apart from those it did.
    Spans are `[start, end)` response-token positions; out-of-range or overlapping parts are clipped."""
    ids = list(response_ids or ())
    pieces: list[tuple[bool, list[int]]] = []
    position = 0
    for span in sorted((int(s[0]), int(s[1])) for s in inserted_spans or () if len(s) == 2):
        start, end = max(span[0], position), min(span[1], len(ids))
        if start >= end:
            continue
        if start > position:
            pieces.append((False, ids[position:start]))
        pieces.append((True, ids[start:end]))
        position = end
    if position < len(ids) or not pieces:
        pieces.append((False, ids[position:]))
    return pieces


def overview(table: pa.Table, failures: list[dict[str, Any]]) -> dict[str, Any]:
    """The run at a glance: steps, experiences, tasks, failed tasks, mean reward and its parts."""
    parts = {name: pc.mean(values).as_py() for name, values in reward_parts(table).items()}
    return {
        "steps": len(set(table.column("step").to_pylist())),
        "experiences": len(table),
        "tasks": len(set(table.column("task_uid").to_pylist())),
        "failed tasks": len(failures),
        "mean reward": pc.mean(table.column("reward")).as_py() if len(table) else None,
        **{f"mean {name}": value for name, value in parts.items()},
        "model versions": sorted(set(table.column("model_version").to_pylist())),
    }


def eval_series(table: pa.Table) -> dict[str, dict[str, StepStats]]:
    """taskset -> `reward`/part -> its distribution at each evaluated step, from the eval experiences."""
    curves: dict[str, dict[str, StepStats]] = {}
    for taskset in sorted(set(table.column("taskset").to_pylist())):
        rows = table.filter(pc.equal(table.column("taskset"), taskset))
        curves[taskset] = reward_series(rows)
    return curves


def metric_names(names: Sequence[str], prefix: str, suffix: str = "") -> list[str]:
    """The metric names under `prefix` (and ending in `suffix`), sorted."""
    return sorted(n for n in names if n.startswith(prefix) and n.endswith(suffix))


def stats_rows(stats: StepStats) -> list[dict[str, Any]]:
    """A `StepStats` as table rows, one per step (for the notebooks' tables under each figure)."""
    return [
        {"step": s, "n": n, "mean": m, "std": d, f"p{SPREAD[0]}": lo, f"p{SPREAD[1]}": hi, "min": a, "max": b}
        for s, n, m, d, lo, hi, a, b in zip(
            stats.steps,
            stats.count,
            stats.mean,
            stats.std,
            stats.low,
            stats.high,
            stats.minimum,
            stats.maximum,
            strict=True,
        )
    ]
