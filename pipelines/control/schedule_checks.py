"""The training tasksets planned and, in a scheduled run (several tasksets, or a selector other than file
order), their scheduler built: every refusal before any engine starts, naming the file and field."""

from __future__ import annotations

from operators.tasks.reader import TasksetPlan, plan_taskset
from operators.tasks.scheduled import ScheduledTasks, schedule_tasks, taskset_key
from schemas.config import Config
from schemas.errors import InputError


def feedback_lag(cfg: Config) -> int:
    """L of the feedback-lag rule: `feedback_lag`, else the sync interval."""
    lag = cfg.buffer.explorer_input.feedback_lag
    return cfg.synchronizer.sync_interval if lag is None else lag


def plan_training(cfg: Config) -> tuple[TasksetPlan, ScheduledTasks | None]:
    """The training plan, and the scheduled run's tasks when it is one (None: the file-order read)."""
    buffer, inputs = cfg.buffer, cfg.buffer.explorer_input
    for i, taskset in enumerate(inputs.eval_tasksets):
        if not taskset.data_selector.is_default:
            raise InputError(
                "an eval taskset is read whole, in file order: drop its data_selector",
                field=f"buffer.explorer_input.eval_tasksets.{i}.data_selector.selector_type",
            )
    if not inputs.selected:
        plan = plan_taskset(inputs.taskset, buffer.batch_size, buffer.total_epochs, buffer.total_steps)
        return plan, None
    tasksets = inputs.training_tasksets
    repeats = {t.repeat_times for t in tasksets}
    if len(repeats) > 1:
        raise InputError(
            f"the tasksets give different repeat_times ({sorted(repeats)}); a step counts its samples by one",
            field=f"{taskset_key(inputs, 1)}.repeat_times",
        )
    plans = [plan_taskset(t, buffer.batch_size, 1, None) for t in tasksets]
    tasks = schedule_tasks(
        inputs, plans, buffer.batch_size, buffer.total_epochs, buffer.total_steps, feedback_lag(cfg)
    )
    return tasks.plan, tasks
