"""Runs and task groups of an experience table: what every op reasons about.

A *run* is one sample of a task, `(task_uid, run_id)`, with all of its segments (a multi-turn run split into
several experiences carries the run's reward on each). A *group* is all of a task's runs in the table: the
stage hands each op whole tasks, so a group is the task's finished samples, whichever runner made them.
Failed or cancelled sub-runs carry no experiences, so they are simply absent: a group may be smaller than
`repeat_times`, and a group of one has nobody to be compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Groups:
    """Index arrays over an experience table's rows, its runs (in order of first row) and its tasks."""

    run_of_row: np.ndarray  # int, per row: which run it belongs to
    task_of_run: np.ndarray  # int, per run: which task (group) it belongs to
    run_reward: np.ndarray  # float64, per run: the mean reward of its segments (they share the run's reward)

    @property
    def num_runs(self) -> int:
        return len(self.task_of_run)

    @property
    def num_tasks(self) -> int:
        return int(self.task_of_run.max()) + 1 if self.num_runs else 0

    def group_size(self) -> np.ndarray:
        """Per run: how many runs its group has."""
        return np.bincount(self.task_of_run, minlength=self.num_tasks)[self.task_of_run]

    def group_mean(self, per_run: np.ndarray) -> np.ndarray:
        """Per run: the mean of `per_run` over its group."""
        sums = np.bincount(self.task_of_run, weights=per_run, minlength=self.num_tasks)
        counts = np.bincount(self.task_of_run, minlength=self.num_tasks)
        return (sums / np.maximum(counts, 1))[self.task_of_run]

    def group_std(self, per_run: np.ndarray, ddof: int) -> np.ndarray:
        """Per run: the standard deviation of `per_run` over its group (0 for a group of <= ddof runs)."""
        deviation = per_run - self.group_mean(per_run)
        squares = np.bincount(self.task_of_run, weights=deviation**2, minlength=self.num_tasks)
        counts = np.bincount(self.task_of_run, minlength=self.num_tasks) - ddof
        return np.sqrt(np.where(counts > 0, squares / np.maximum(counts, 1), 0.0))[self.task_of_run]

    def group_agrees(self) -> np.ndarray:
        """Per run: whether every run of its group has the same reward (exactly, not up to rounding)."""
        low = np.full(self.num_tasks, np.inf)
        high = np.full(self.num_tasks, -np.inf)
        np.minimum.at(low, self.task_of_run, self.run_reward)
        np.maximum.at(high, self.task_of_run, self.run_reward)
        return (low == high)[self.task_of_run]

    def rows(self, per_run: np.ndarray) -> np.ndarray:
        """A per-run array spread to the rows (each segment takes its run's value)."""
        return per_run[self.run_of_row]


def groups_of(experiences: pa.Table) -> Groups:
    """The runs and groups of `experiences` (any row order; a task's runs need not be adjacent)."""
    tasks = experiences.column("task_uid").to_pylist()
    run_ids = experiences.column("run_id").to_pylist()
    runs: dict[tuple[str, int], int] = {}
    run_of_row = np.array([runs.setdefault(key, len(runs)) for key in zip(tasks, run_ids, strict=True)], int)
    task_index: dict[str, int] = {}
    task_of_run = np.array([task_index.setdefault(task, len(task_index)) for task, _ in runs], int)
    rewards = experiences.column("reward").to_numpy(zero_copy_only=False).astype(np.float64)
    sums = np.bincount(run_of_row, weights=rewards, minlength=len(runs))
    counts = np.bincount(run_of_row, minlength=len(runs))
    return Groups(run_of_row, task_of_run, sums / np.maximum(counts, 1))


def sampled_tokens(experiences: pa.Table) -> np.ndarray:
    """Per row: the response tokens the policy sampled (action mask true); inserted tokens do not count."""
    mask = experiences.column("action_mask").combine_chunks()
    if not len(mask):
        return np.zeros(0, int)
    flat = pc.list_flatten(mask).to_numpy(zero_copy_only=False).astype(int)
    ends = np.cumsum(pc.list_value_length(mask).to_numpy(zero_copy_only=False))
    totals = np.concatenate([[0], np.cumsum(flat)])
    return totals[ends] - totals[np.concatenate([[0], ends[:-1]])]


def keep_rows(experiences: pa.Table, keep: np.ndarray) -> pa.Table:
    """The rows where `keep` is true, in their order."""
    return experiences if keep.all() else experiences.filter(pa.array(keep, pa.bool_()))


def set_column(experiences: pa.Table, name: str, values: pa.Array) -> pa.Table:
    """`experiences` with column `name` replaced, keeping its type."""
    index = experiences.schema.get_field_index(name)
    return experiences.set_column(index, experiences.schema.field(index), values)
