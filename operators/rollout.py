"""The rollout operator: a Ray Data async actor pool that forwards each Task row to an engine actor.

Pool actors hold only engine handles (looked up by name); state worth keeping lives in engines and the driver.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pyarrow as pa

from operators.engine_client import EngineClient
from operators.workflow_runner import run_task
from schemas.status import results_to_table
from schemas.task import tasks_from_table


class RolloutOperator:
    """`map_batches` callable: Task table in, result table (status + experiences per task) out."""

    def __init__(
        self, engine_names: list[str], max_timeout: float, max_retry_times: int, plugin_dirs: list[str] = ()
    ):
        import ray

        from operators.plugins import load_plugins

        for plugin_dir in plugin_dirs:  # users' workflows must be registered in this worker too
            load_plugins(Path(plugin_dir))

        from pipelines.runtime import NAMESPACE

        self.clients = [
            EngineClient(ray.get_actor(name, namespace=NAMESPACE), name=name) for name in engine_names
        ]
        self.turn = itertools.cycle(range(len(self.clients)))
        self.max_timeout = max_timeout
        self.max_retry_times = max_retry_times

    async def __call__(self, batch: pa.Table) -> pa.Table:
        tasks = tasks_from_table(batch)
        rows = await asyncio.gather(
            *(
                run_task(
                    task,
                    self.clients[next(self.turn)],
                    max_timeout=self.max_timeout,
                    max_retry_times=self.max_retry_times,
                )
                for task in tasks
            )
        )
        return results_to_table(list(rows))
