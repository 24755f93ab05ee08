"""The training tasks of a scheduled run (several tasksets, or a selector other than file order), on the
driver: every taskset's tasks held as one Arrow table each, its selector built on its `feature_keys`, and
each step's table cut from the scheduler's picks (`operators.tasks.scheduler`).

Selectors draw any row at any time, so the tasks are held whole rather than streamed from their files: a
curriculum's tasksets are what fits in memory. Everything here is checked before any engine starts, and a
refusal names the file, row and field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from operators.tasks.reader import TasksetPlan, iter_task_tables
from operators.tasks.rows import json_type, source_rows
from operators.tasks.scheduler import Pick, TaskScheduler, TasksetMix
from operators.tasks.selectors import SelectorBase, feature_count_problem, selector_class
from schemas.config import ExplorerInput, TasksetConfig
from schemas.errors import InputError
from schemas.task import TASK_SCHEMA, make_task_uid

PREFIX = "buffer.explorer_input"


def taskset_key(inputs: ExplorerInput, index: int) -> str:
    """The config key of training taskset `index`."""
    return f"{PREFIX}.tasksets.{index}" if inputs.tasksets else f"{PREFIX}.taskset"


def taskset_table(cfg: TasksetConfig, plan: TasksetPlan, workflow: str) -> pa.Table:
    """Every task of the taskset, in file order (its `index` its position), its step still to be set."""
    tables = [
        table
        for file_index in range(len(plan.files))
        for table in iter_task_tables(cfg, plan, file_index, 0, workflow=workflow)
    ]
    return pa.concat_tables(tables) if tables else TASK_SCHEMA.empty_table()


def read_features(cfg: TasksetConfig, plan: TasksetPlan, field: str) -> np.ndarray:
    """The `feature_keys` columns of the taskset's usable rows (rows x keys), each a finite number."""
    keys = cfg.data_selector.feature_keys
    values: list[list[float]] = []
    for file, _ in plan.files:
        skipped = set(plan.skipped_in(file))
        for row, record in source_rows(cfg, Path(file), skip_bad=bool(skipped)):
            if row in skipped or isinstance(record, InputError):
                continue
            line = []
            for key in keys:
                value = record.get(key)
                ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
                if not ok:
                    problem = "missing" if value is None else f"expected a number, got {json_type(value)}"
                    raise InputError(
                        f"{problem} (a feature key of {field}.data_selector)", file=file, row=row, field=key
                    )
                line.append(float(value))
            values.append(line)
    return np.array(values, dtype=float).reshape(len(values), len(keys))


def build_selector(cfg: TasksetConfig, plan: TasksetPlan, field: str) -> SelectorBase:
    """The taskset's selector, its name and feature keys checked (InputError naming the config key)."""
    selector = cfg.data_selector
    try:
        cls = selector_class(selector.selector_type)
    except KeyError as exc:
        raise InputError(exc.args[0], field=f"{field}.data_selector.selector_type") from None
    if problem := feature_count_problem(cls, len(selector.feature_keys)):
        raise InputError(f"{selector.selector_type} {problem}", field=f"{field}.data_selector.feature_keys")
    return cls(plan.rows, read_features(cfg, plan, field), selector)


@dataclass
class ScheduledTasks:
    """The driver's source of training tasks in a scheduled run: the scheduler, each taskset's tasks, and
    the combined plan the step committer counts steps by."""

    scheduler: TaskScheduler
    tables: list[pa.Table]
    names: list[str]
    plan: TasksetPlan
    joined: pa.Table | None = None  # every taskset's tasks, one after another

    def step_table(self, step: int) -> tuple[pa.Table, list[Pick]]:
        """Step `step`'s task rows, in the scheduler's order, and the picks they are. A task drawn again
        is named by its draw (`<taskset>/e<draw // size>/<draw % size>`), so no two picks share a uid; in
        file order that is the same name as an unscheduled run's."""
        picks = self.scheduler.draw(step, self.plan.tasks_in_step(step))
        starts = np.cumsum([0] + [t.num_rows for t in self.tables])
        table = self.all_tasks.take(pa.array([starts[p.taskset] + p.row for p in picks], pa.int64()))
        sizes = [self.tables[p.taskset].num_rows for p in picks]
        epochs = [p.draw // size for p, size in zip(picks, sizes, strict=True)]
        uids = [
            make_task_uid(self.names[p.taskset], epoch, p.draw % size)
            for p, size, epoch in zip(picks, sizes, epochs, strict=True)
        ]
        columns = {"task_uid": pa.array(uids), "epoch": pa.array(epochs, pa.int32())}
        columns["step"] = pa.array([step] * len(picks), pa.int64())
        for name, column in columns.items():
            table = table.set_column(table.schema.get_field_index(name), name, column)
        return table, picks

    @property
    def all_tasks(self) -> pa.Table:
        if self.joined is None:
            self.joined = pa.concat_tables(self.tables)
        return self.joined


def schedule_tasks(
    inputs: ExplorerInput,
    plans: list[TasksetPlan],
    batch_size: int,
    total_epochs: int,
    total_steps: int | None,
    lag: int,
) -> ScheduledTasks:
    """The scheduled run's tasks over the planned training tasksets (`plans`, in config order)."""
    tasksets = inputs.training_tasksets
    selectors = [
        build_selector(t, p, taskset_key(inputs, i))
        for i, (t, p) in enumerate(zip(tasksets, plans, strict=True))
    ]
    mix = TasksetMix([p.rows for p in plans], [t.weight for t in tasksets], inputs.mix_seed)
    tables = [
        taskset_table(t, p, inputs.workflow_for(t, is_eval=False))
        for t, p in zip(tasksets, plans, strict=True)
    ]
    plan = TasksetPlan(
        files=tuple(f for p in plans for f in p.files),
        batch_size=batch_size,
        total_epochs=total_epochs,
        total_steps=total_steps,
        skipped=tuple(s for p in plans for s in p.skipped),
        skip_messages=tuple(m for p in plans for m in p.skip_messages),
        epoch_tasks=mix.epoch_length,
    )
    scheduler = TaskScheduler(selectors, mix, batch_size, lag)
    return ScheduledTasks(scheduler, tables, [t.name for t in tasksets], plan)
