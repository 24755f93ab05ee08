"""Workflow registry and base class: a workflow turns one Task into Experiences using an engine client.

Every workflow class declares how the runner may drive it (Trinity-RFT's meanings):

- `resettable`: an instance can be `reset(task)` and reused for another task instead of being rebuilt.
- `repeatable`: one `run` call produces all requested repeats itself (e.g. with vLLM's `n`). A workflow that
  is not is run once per repeat, with `repeat_times=1` and consecutive `run_id_base`s.
- `asynchronous`: `run` is a coroutine, awaited on the rollout operator's event loop. A synchronous workflow
  (`asynchronous = False`, plain `def run`) would block that loop, so the runner calls it in a worker thread
  (`asyncio.to_thread`); from there it reaches the async engine client through
  `asyncio.run_coroutine_threadsafe(..., loop)`, and a timeout cannot stop the thread, only stop waiting.
  All built-ins are asynchronous.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from operators.engine.client import EngineClient
from operators.rollout.registration import import_all, lookup, register_once
from schemas.experience import Experience
from schemas.task import Task

BUILTIN_MODULES = (
    "operators.workflows.single_turn",
    "operators.workflows.math_boxed",
    "operators.workflows.countdown",
    "operators.workflows.eval_math",
    "operators.workflows.tool_math",
    "operators.workflows.command_agent",
    "operators.workflows.tool_math_fc",
)
FLAGS = ("resettable", "repeatable", "asynchronous")


class Workflow(Protocol):
    resettable: ClassVar[bool]
    repeatable: ClassVar[bool]
    asynchronous: ClassVar[bool]

    def reset(self, task: Task) -> None: ...

    def run(
        self, task: Task, engine: EngineClient, run_id_base: int = 0, *, repeat_times: int | None = None
    ) -> Any: ...  # list[Experience], or a coroutine of it when asynchronous


class WorkflowBase:
    """Defaults: rebuilt per task, all repeats in one call, `run` a coroutine."""

    resettable: ClassVar[bool] = False
    repeatable: ClassVar[bool] = True
    asynchronous: ClassVar[bool] = True

    def reset(self, task: Task) -> None:
        """Prepare this instance for `task`; only resettable workflows implement it."""
        why = "does not implement reset" if self.resettable else "is not resettable; build one per task"
        raise NotImplementedError(f"workflow {type(self).__name__} {why}")

    async def run(
        self, task: Task, engine: EngineClient, run_id_base: int = 0, *, repeat_times: int | None = None
    ) -> list[Experience]:
        """Experiences with run ids `run_id_base .. run_id_base + n - 1`, n = repeat_times or task's."""
        raise NotImplementedError


WORKFLOWS: dict[str, type[Workflow]] = {}


def repeats(task: Task, repeat_times: int | None) -> int:
    """How many samples a run call must produce: the sub-range asked for, else the task's repeat_times."""
    n = task.repeat_times if repeat_times is None else repeat_times
    if n < 1:
        raise ValueError(f"repeat_times must be >= 1, got {n}")
    return n


def check_workflow_class(cls: type) -> None:
    """Refuse at registration what the runner could not drive: missing flags or a run of the wrong kind."""
    missing = [flag for flag in FLAGS if not isinstance(getattr(cls, flag, None), bool)]
    if missing or not callable(getattr(cls, "run", None)):
        raise TypeError(
            f"workflow {cls.__qualname__} needs a run method and bool flags {FLAGS} (missing {missing}); "
            "subclass WorkflowBase"
        )
    if inspect.iscoroutinefunction(cls.run) != cls.asynchronous:
        kind = "async def" if cls.asynchronous else "def"
        raise TypeError(f"workflow {cls.__qualname__}: asynchronous={cls.asynchronous} needs `{kind} run`")


def register_workflow(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        check_workflow_class(cls)
        register_once(WORKFLOWS, "workflow", name, cls)
        return cls

    return wrap


def load_builtins() -> None:
    """Import the built-in workflows (lazily: they pull in the reward functions and math-verify)."""
    import_all(BUILTIN_MODULES)


def workflow_class(name: str) -> type[Workflow]:
    """The registered class, so the runner can read its flags before building an instance."""
    load_builtins()
    return lookup(WORKFLOWS, "workflow", name)


def create_workflow(name: str) -> Workflow:
    return workflow_class(name)()


async def run_workflow(
    workflow: Workflow,
    task: Task,
    engine: EngineClient,
    run_id_base: int = 0,
    repeat_times: int | None = None,
) -> list[Experience]:
    """Drive `workflow` per its flags: one call if repeatable, else one per repeat; sync ones in a thread."""
    n = repeats(task, repeat_times)
    calls = [(run_id_base, n)] if workflow.repeatable else [(run_id_base + i, 1) for i in range(n)]
    experiences: list[Experience] = []
    for base, count in calls:
        if workflow.asynchronous:
            experiences += await workflow.run(task, engine, base, repeat_times=count)
        else:
            experiences += await asyncio.to_thread(workflow.run, task, engine, base, repeat_times=count)
    return experiences
