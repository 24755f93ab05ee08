"""Runs tasks' workflows as Trinity-RFT's scheduler does, and always returns a result row per sub-run.

- A task's repeats are split into sub-runs of at most `max_repeat_times_per_runner`, with run ids kept
  `0..repeat_times-1`; each sub-run is retried on its own and yields its own result row, ok or failed.
- Each attempt has `max_timeout`, or with a dynamic timeout a multiple of the mean task time so far; a
  timed-out attempt is cancelled (the engine aborts the request).
- A failure is an exception, a timeout, a malformed experience or wrong run ids. The instance that failed is
  dropped, so the next attempt gets a fresh one; otherwise resettable workflows are reused across tasks.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

from operators.engine.client import EngineClient
from operators.workflows.base import Workflow, run_workflow, workflow_class
from schemas.errors import STALE, StaleRequest, TaskInputError
from schemas.experience import Experience, MalformedExperience
from schemas.rollout_policy import DynamicTimeoutConfig
from schemas.status import Status, result_row
from schemas.task import Task


def describe(exc: BaseException) -> str:
    """One line for a failure; a remote error is reported by its root cause, not Ray's wrapper."""
    while getattr(exc, "cause", None) is not None or exc.__cause__ is not None:
        exc = getattr(exc, "cause", None) or exc.__cause__
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"


def runs_per_task(repeat_times: int, max_repeat_times_per_runner: int | None) -> int:
    """How many result rows one task yields: ceil(R / M) sub-runs, or 1 when repeats are not split."""
    if max_repeat_times_per_runner is None:
        return 1
    return -(-repeat_times // max_repeat_times_per_runner)


@dataclass
class SubRun:
    """One runner's share of a task, run ids `run_id_base .. run_id_base + repeat_times - 1`.

    It records its attempts and start time as it goes, so a sub-run cancelled from outside (batch timeout)
    can still be reported faithfully.
    """

    task: Task
    run_id_base: int
    repeat_times: int
    attempts: int = 0
    started: float | None = None

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def row(self, status: Status, experiences: list[Experience]) -> dict[str, Any]:
        task = self.task
        return result_row(
            task_uid=task.task_uid,
            taskset=task.taskset,
            step=task.step,
            is_eval=task.is_eval,
            run_id_base=self.run_id_base,
            repeat_times=self.repeat_times,
            status=status,
            task_run_time=self.elapsed(),
            experiences=experiences,
        )

    def ok_row(self, runner: str, experiences: list[Experience]) -> dict[str, Any]:
        status = Status(ok=True, metric=mean_metrics(experiences), attempts=self.attempts, runner=runner)
        return self.row(status, experiences)

    def failed_row(self, runner: str, message: str) -> dict[str, Any]:
        """A failed sub-run carries no experiences: none of its samples may reach the sink."""
        return self.row(Status(ok=False, message=message, attempts=self.attempts, runner=runner), [])


def split_task(task: Task, max_repeat_times_per_runner: int | None) -> list[SubRun]:
    """The task's sub-runs: bases 0, M, 2M, ... each asking for min(M, R - base) repeats."""
    size = max_repeat_times_per_runner or task.repeat_times
    return [
        SubRun(task, base, min(size, task.repeat_times - base)) for base in range(0, task.repeat_times, size)
    ]


def mean_metrics(experiences: list[Experience]) -> dict[str, float]:
    """The sub-run's metric: mean reward and the mean of each per-experience metric."""
    values: dict[str, list[float]] = defaultdict(list)
    for experience in experiences:
        values["reward"].append(experience.reward)
        for key, value in experience.metrics.items():
            values[key].append(float(value))
    return {key: sum(v) / len(v) for key, v in values.items()}


def check_experiences(experiences: list[Experience], sub: SubRun) -> None:
    """Refuse what would corrupt the sink: malformed rows, another task's rows, missing or extra run ids,
    and segments of a run that are not 0, 1, ... once each."""
    segments: dict[int, list[int]] = defaultdict(list)
    for experience in experiences:
        experience.validate()
        if experience.task_uid != sub.task.task_uid:
            raise MalformedExperience(f"{experience.uid}: produced for task {sub.task.task_uid}")
        segments[experience.run_id].append(experience.segment)
    expected = list(range(sub.run_id_base, sub.run_id_base + sub.repeat_times))
    got = sorted(segments)
    if got != expected:
        raise MalformedExperience(
            f"{sub.task.task_uid}: run ids {got} where {expected[0]}..{expected[-1]} were asked for"
        )
    for run_id, found in segments.items():
        if sorted(found) != list(range(len(found))):
            raise MalformedExperience(
                f"{sub.task.task_uid}/{run_id}: segments {sorted(found)}, where 0..{len(found) - 1} "
                "once each were expected"
            )


def add_task_info(experiences: list[Experience], task: Task) -> None:
    """The task's own info as each experience's `info.task`, whatever workflow made it (a plugin's too);
    keys the workflow wrote stay beside it, as do those ops add later (`pass_rate`, ...)."""
    if task.info:
        for experience in experiences:
            experience.info["task"] = task.info


class WorkflowPool:
    """Idle instances of resettable workflows by name: reused across tasks, never shared by two at once."""

    def __init__(self) -> None:
        self.idle: dict[str, list[Workflow]] = defaultdict(list)

    def acquire(self, task: Task) -> Workflow:
        """An idle instance reset for `task`, else a new one; one that is not resettable is always new."""
        cls = workflow_class(task.workflow)
        idle = self.idle[task.workflow]
        workflow = idle.pop() if cls.resettable and idle else cls()
        if cls.resettable:
            workflow.reset(task)
        return workflow

    def release(self, task: Task, workflow: Workflow) -> None:
        """Keep an instance that succeeded; one that failed is never released, so it is dropped."""
        if workflow.resettable:
            self.idle[task.workflow].append(workflow)


class DynamicTimeout:
    """`min(max_timeout, ratio x mean successful task time)`, once `min_samples` tasks have succeeded.

    The mean is the forwarder's own (its recent tasks), so one slow task cannot hold a step for `max_timeout`
    while the bound still follows the workload: longer answers after an update raise it with them.
    """

    def __init__(self, ratio: float, min_samples: int, window: int = 256):
        self.ratio, self.min_samples = ratio, min_samples
        self.times: deque[float] = deque(maxlen=window)

    def observe(self, seconds: float) -> None:
        self.times.append(seconds)

    def bound(self, max_timeout: float) -> float:
        if len(self.times) < self.min_samples:
            return max_timeout
        return min(max_timeout, self.ratio * sum(self.times) / len(self.times))


def dynamic_runner_timeout(cfg: DynamicTimeoutConfig | None) -> DynamicTimeout | None:
    return DynamicTimeout(cfg.ratio, cfg.min_samples) if cfg is not None and cfg.enable else None


class WorkflowRunner:
    """Runs sub-runs with a per-attempt timeout and retries; one per forwarder actor, for all its batches."""

    def __init__(
        self,
        max_timeout: float,
        max_retry_times: int,
        pool: WorkflowPool | None = None,
        dynamic: DynamicTimeout | None = None,
    ):
        self.max_timeout = max_timeout
        self.max_retry_times = max_retry_times
        self.pool = pool or WorkflowPool()
        self.dynamic = dynamic

    def timeout(self) -> float:
        return self.max_timeout if self.dynamic is None else self.dynamic.bound(self.max_timeout)

    async def run(self, sub: SubRun, engine: EngineClient) -> dict[str, Any]:
        """Its result row; only a cancellation from outside (batch timeout) escapes as an exception."""
        sub.started = time.monotonic()
        message = ""
        for attempt in range(1, self.max_retry_times + 2):
            sub.attempts = attempt
            timeout, began = self.timeout(), time.monotonic()
            try:
                experiences = await asyncio.wait_for(self.attempt(sub, engine), timeout=timeout)
                if self.dynamic is not None:
                    self.dynamic.observe(time.monotonic() - began)
                return sub.ok_row(engine.name, experiences)
            except TimeoutError:
                message = f"attempt {attempt} timed out after {round(timeout, 3):g}s"
            except TaskInputError as exc:  # the same input would fail again: no retry
                return sub.failed_row(engine.name, f"attempt {attempt}: {describe(exc)}")
            except StaleRequest as exc:  # it could never commit in time: a retry would be as stale
                return sub.failed_row(engine.name, f"{STALE} attempt {attempt}: {describe(exc)}")
            except Exception as exc:  # a workflow bug must cost one sub-run, not the run
                message = f"attempt {attempt}: {describe(exc)}"
        return sub.failed_row(engine.name, message)

    async def attempt(self, sub: SubRun, engine: EngineClient) -> list[Experience]:
        workflow = self.pool.acquire(sub.task)
        experiences = await run_workflow(workflow, sub.task, engine, sub.run_id_base, sub.repeat_times)
        check_experiences(experiences, sub)
        add_task_info(experiences, sub.task)
        self.pool.release(sub.task, workflow)
        return experiences


async def run_task(
    task: Task, engine: EngineClient, *, max_timeout: float, max_retry_times: int
) -> dict[str, Any]:
    """The whole task as one sub-run (no split, a fresh pool): the result row of a single task."""
    runner = WorkflowRunner(max_timeout, max_retry_times)
    return await runner.run(SubRun(task, 0, task.repeat_times), engine)
