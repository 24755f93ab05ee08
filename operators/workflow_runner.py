"""Runs one task's workflow with a per-attempt timeout and retries, and always returns a result row.

A timed-out attempt is cancelled (the engine aborts the request); a failing workflow instance is recreated
before the next attempt; malformed experiences count as a failure, never reach the sink.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from operators.engine_client import EngineClient
from operators.workflows.registry import create_workflow
from schemas.experience import Experience
from schemas.status import Status, result_row
from schemas.task import Task


def describe(exc: BaseException) -> str:
    """One line for a failure; a remote error is reported by its root cause, not Ray's wrapper."""
    while getattr(exc, "cause", None) is not None or exc.__cause__ is not None:
        exc = getattr(exc, "cause", None) or exc.__cause__
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"


async def run_task(
    task: Task, engine: EngineClient, *, max_timeout: float, max_retry_times: int
) -> dict[str, Any]:
    started = time.monotonic()
    message = None
    experiences: list[Experience] = []
    attempts = 0
    for attempts in range(1, max_retry_times + 2):
        try:
            workflow = create_workflow(task.workflow)
            experiences = await asyncio.wait_for(workflow.run(task, engine), timeout=max_timeout)
            for experience in experiences:
                experience.validate()
            message = None
            break
        except TimeoutError:
            message = f"attempt {attempts} timed out after {max_timeout:g}s"
        except Exception as exc:  # a workflow bug must cost one task, not the run
            message = f"attempt {attempts}: {describe(exc)}"
        experiences = []
    ok = message is None
    metric = {}
    if ok and experiences:
        metric = {"reward": sum(e.reward for e in experiences) / len(experiences)}
    return result_row(
        task_uid=task.task_uid,
        taskset=task.taskset,
        step=task.step,
        is_eval=task.is_eval,
        status=Status(ok=ok, metric=metric, message=message, attempts=attempts, runner=engine.name),
        task_run_time=time.monotonic() - started,
        experiences=experiences,
    )
