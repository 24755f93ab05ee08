"""The Ray Data plan: read tasks → rollout (async actor pool forwarding to engines) → sink fragments."""

from __future__ import annotations

from pathlib import Path

import ray

from operators.parquet_sink import write_fragments
from operators.rollout import RolloutOperator
from operators.taskset_reader import TasksetPlan
from operators.taskset_source import TasksetDatasource
from schemas.config import Config

FORWARDER_CPUS = 0.25  # forwarding actors mostly wait; whole CPUs for them would starve the read tasks


def rollout_dataset(
    cfg: Config, plan: TasksetPlan, engine_names: list[str], sink_root: Path
) -> ray.data.Dataset:
    """A lazy dataset whose rows are per-task records of the sink (one per dispatched task)."""
    explorer = cfg.explorer
    tasks = ray.data.read_datasource(TasksetDatasource(cfg.buffer.explorer_input.taskset, plan))
    results = tasks.map_batches(
        RolloutOperator,
        fn_constructor_kwargs={
            "engine_names": engine_names,
            "max_timeout": explorer.max_timeout,
            "max_retry_times": explorer.max_retry_times,
        },
        batch_size=cfg.buffer.batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(
            size=len(engine_names),
            max_tasks_in_flight_per_actor=explorer.runner_per_model,
            max_concurrent_calls_per_actor=explorer.runner_per_model,
        ),
        num_cpus=FORWARDER_CPUS,
    )
    return results.map_batches(
        write_fragments, fn_kwargs={"root": str(sink_root)}, batch_format="pyarrow", num_cpus=FORWARDER_CPUS
    )
