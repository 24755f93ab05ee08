"""Ray Data datasources: over a planned taskset, a read task per (file, epoch), blocks cut at steps; and in a
scheduled run, one read task taking each step's tasks from the step gate as the driver draws them."""

from __future__ import annotations

import ray
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from operators.actors.names import NAMESPACE
from operators.tasks.reader import TasksetPlan, iter_task_tables, read_units
from schemas.config import TasksetConfig
from schemas.task import TASK_SCHEMA


class TasksetDatasource(Datasource):
    """`read_kwargs` go to `iter_task_tables`: is_eval, workflow, first_step (resume), step_label (eval)."""

    def __init__(self, cfg: TasksetConfig, plan: TasksetPlan, **read_kwargs):
        self.cfg, self.plan, self.read_kwargs = cfg, plan, read_kwargs

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def num_read_tasks(self) -> int:
        """How many read tasks `get_read_tasks` makes: passed as `override_num_blocks`, so Ray Data does not
        split each read task's blocks to reach its default parallelism (about 200 blocks). Split, a step's
        64 rows became some 200 blocks of a row or none, and the rollout stage waited on their bundling."""
        return max(1, len(self.units()))

    def units(self) -> list[tuple[int, int]]:
        """The (file index, epoch) pairs left to read from the run's first step on: one read task each."""
        return read_units(self.plan, self.read_kwargs.get("first_step", 1))

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None):
        cfg, plan, kwargs = self.cfg, self.plan, self.read_kwargs
        tasks = []
        for file_index, epoch in self.units():

            def read(file_index: int = file_index, epoch: int = epoch):
                yield from iter_task_tables(cfg, plan, file_index, epoch, **kwargs)

            meta = BlockMetadata(
                num_rows=None, size_bytes=None, exec_stats=None, input_files=[plan.files[file_index][0]]
            )
            tasks.append(ReadTask(read, meta, schema=TASK_SCHEMA, per_task_row_limit=per_task_row_limit))
        return tasks


class FedDatasource(Datasource):
    """A scheduled run's tasks, step by step from `first_step` to `last_step`: each step's rows are posted to
    the gate by the driver (`StepGate.post`) once the feedback they depend on is committed, so a read waits on
    the gate rather than on a file. One read task a step: Ray Data holds a read task's small blocks back until
    they fill a block or the task ends, so a task reading several steps would wait on a step that waits on
    those it holds."""

    def __init__(self, gate_name: str, first_step: int, last_step: int):
        self.gate_name, self.first_step, self.last_step = gate_name, first_step, last_step

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def num_read_tasks(self) -> int:
        return max(1, self.last_step - self.first_step + 1)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context=None):
        tasks = []
        for step in range(self.first_step, self.last_step + 1):

            def read(step: int = step, gate_name: str = self.gate_name):
                gate = ray.get_actor(gate_name, namespace=NAMESPACE)
                yield ray.get(gate.tasks.remote(step))

            meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None)
            tasks.append(ReadTask(read, meta, schema=TASK_SCHEMA, per_task_row_limit=per_task_row_limit))
        return tasks
