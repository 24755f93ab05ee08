"""Benchmark statistics on plain data: point estimates and bootstrap 95% intervals, resampled by task.

A task's k samples share a prompt, so they are not independent draws: resampling single experiences would
make the interval too narrow. The bootstrap therefore draws whole tasks with replacement, each with all of its
samples, and recomputes every statistic on the drawn set. The generator is seeded, so the same inputs always
give the same interval (a rerun of a benchmark must not move its error bars).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from operators.rollout.eval_metrics import pass_at_k

RESAMPLES = 2000
SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class Estimate:
    """A statistic and its bootstrap interval (low == high == value when there is one task or none)."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class TaskSamples:
    """Per-task arrays: sample counts, sums of accuracy and length, and pass@k."""

    task_ids: list[str]
    counts: np.ndarray
    accuracy_sum: np.ndarray
    passed: np.ndarray  # pass@k per task, with k its sample count
    length_sum: np.ndarray


def per_task_pass(where: np.ndarray, accuracy: np.ndarray, n: int) -> np.ndarray:
    """pass@k of each task over all its samples (k = its sample count): a sample with accuracy 1 passes."""
    correct: list[list[bool]] = [[] for _ in range(n)]
    for task, value in zip(where.tolist(), accuracy.tolist(), strict=True):
        correct[task].append(value >= 1.0)
    return np.array([pass_at_k(c, len(c)) for c in correct], dtype=np.float64)


def group_by_task(task_ids: Sequence[str], accuracy: Sequence[float], lengths: Sequence[int]) -> TaskSamples:
    """Fold per-experience values into per-task sums, in first-seen task order (deterministic)."""
    if not (len(task_ids) == len(accuracy) == len(lengths)):
        raise ValueError("task_ids, accuracy and lengths must have one entry per experience")
    index: dict[str, int] = {}
    for uid in task_ids:
        index.setdefault(uid, len(index))
    n = len(index)
    where = np.fromiter((index[u] for u in task_ids), dtype=np.int64, count=len(task_ids))
    acc = np.asarray(accuracy, dtype=np.float64)
    counts = np.bincount(where, minlength=n).astype(np.float64)
    return TaskSamples(
        task_ids=list(index),
        counts=counts,
        accuracy_sum=np.bincount(where, weights=acc, minlength=n),
        passed=per_task_pass(where, acc, n),
        length_sum=np.bincount(where, weights=np.asarray(lengths, dtype=np.float64), minlength=n),
    )


def _statistics(t: TaskSamples, draws: np.ndarray) -> dict[str, np.ndarray]:
    """Every statistic for each row of task indices in `draws` (shape: resamples × tasks)."""
    counts = t.counts[draws].sum(axis=1)
    return {
        # pooled over experiences: a task with fewer samples (some failed) weighs less
        "accuracy": t.accuracy_sum[draws].sum(axis=1) / counts,
        # per task, then averaged over tasks: each task weighs the same, as in Trinity-RFT's mean@k / pass@k
        "mean_at_k": (t.accuracy_sum / t.counts)[draws].mean(axis=1),
        "pass_at_k": t.passed[draws].mean(axis=1),
        "response_length": t.length_sum[draws].sum(axis=1) / counts,
    }


def task_estimates(
    task_ids: Sequence[str],
    accuracy: Sequence[float],
    lengths: Sequence[int],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = LEVEL,
) -> dict[str, Estimate]:
    """`accuracy`, `mean_at_k`, `pass_at_k` and `response_length`, each with a percentile bootstrap interval.

    pass@k counts a task as solved when one of its samples has accuracy 1. Empty input gives no estimates.
    """
    if not len(task_ids):
        return {}
    tasks = group_by_task(task_ids, accuracy, lengths)
    n = len(tasks.task_ids)
    point = {name: float(v[0]) for name, v in _statistics(tasks, np.arange(n)[None, :]).items()}
    if n < 2:
        return {name: Estimate(v, v, v) for name, v in point.items()}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    tail = (1.0 - level) / 2 * 100
    out = {}
    for name, values in _statistics(tasks, draws).items():
        low, high = np.percentile(values, [tail, 100 - tail])
        # the percentile interval can exclude the point estimate by float rounding only; keep it inside
        out[name] = Estimate(point[name], min(float(low), point[name]), max(float(high), point[name]))
    return out
