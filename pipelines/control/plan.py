"""The Ray Data plan: read tasks, then rollout (actor pool forwarding to engines and writing fragments)."""

from __future__ import annotations

from pathlib import Path

import ray

from operators.rollout.operator import RolloutOperator, RolloutStage
from operators.tasks.datasource import FedDatasource, TasksetDatasource
from operators.tasks.reader import TasksetPlan
from schemas.config import Config, TasksetConfig

FED_READS = 4  # a scheduled run's read tasks at once: the next steps, each waiting for the driver to post it
FORWARDER_CPUS = 0.25  # forwarding actors mostly wait; whole CPUs for them would starve the read tasks


def rollout(tasks: ray.data.Dataset, cfg: Config, stage: RolloutStage) -> ray.data.Dataset:
    """Task rows → result rows (status + experiences per task), by forwarding actors that call the engines."""
    explorer = cfg.explorer
    return tasks.map_batches(
        RolloutOperator,
        fn_constructor_args=(stage,),
        batch_size=cfg.buffer.batch_size,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(
            size=len(stage.engine_names),
            max_tasks_in_flight_per_actor=explorer.runner_per_model,
            max_concurrent_calls_per_actor=explorer.runner_per_model,
        ),
        num_cpus=FORWARDER_CPUS,
    )


def explore_dataset(
    cfg: Config,
    plan: TasksetPlan,
    engine_names: list[str],
    sink_root: Path,
    gate_name: str,
    first_step: int = 1,
) -> ray.data.Dataset:
    """The training stream from `first_step` on; batches write fragments and report records to the gate."""
    explorer_input = cfg.buffer.explorer_input
    if explorer_input.selected:  # the driver draws each step's tasks (`pipelines.control.feed`)
        source = FedDatasource(gate_name, first_step, plan.num_steps)
    else:
        workflow = explorer_input.workflow_for(explorer_input.taskset, is_eval=False)
        source = TasksetDatasource(explorer_input.taskset, plan, workflow=workflow, first_step=first_step)
    ops = [op.model_dump(mode="json") for op in explorer_input.experience_ops]  # training steps only
    stage = RolloutStage.from_config(cfg, engine_names, gate_name, sink_root, ops, plan.num_steps)
    return rollout(read(source), cfg, stage)


def eval_dataset(
    cfg: Config, taskset: TasksetConfig, plan: TasksetPlan, engine_names: list[str], step: int
) -> ray.data.Dataset:
    """One eval taskset, whole, as result rows labelled with the explore step being evaluated."""
    workflow = cfg.buffer.explorer_input.workflow_for(taskset, is_eval=True)
    source = TasksetDatasource(taskset, plan, is_eval=True, workflow=workflow, step_label=step)
    return rollout(read(source), cfg, RolloutStage.from_config(cfg, engine_names))


def read(source: TasksetDatasource | FedDatasource) -> ray.data.Dataset:
    """The task rows, in the blocks the source cuts (one step each), never split further by Ray Data. A fed
    read's tasks mostly wait on the gate: they take no CPU, and only a few run at once."""
    if isinstance(source, FedDatasource):
        return ray.data.read_datasource(
            source, override_num_blocks=source.num_read_tasks(), num_cpus=0, concurrency=FED_READS
        )
    return ray.data.read_datasource(source, override_num_blocks=source.num_read_tasks())
