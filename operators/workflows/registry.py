"""Workflow registry: a workflow turns one Task into Experiences using an engine client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from operators.engine_client import EngineClient
from schemas.experience import Experience
from schemas.task import Task


class Workflow(Protocol):
    async def run(self, task: Task, engine: EngineClient, run_id_base: int = 0) -> list[Experience]: ...


WORKFLOWS: dict[str, Callable[[], Workflow]] = {}


def register_workflow(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        if name in WORKFLOWS and WORKFLOWS[name] is not cls:
            raise ValueError(f"workflow '{name}' is already registered")
        WORKFLOWS[name] = cls
        return cls

    return wrap


def create_workflow(name: str) -> Workflow:
    import operators.workflows.math  # noqa: F401  (registers the built-ins)

    try:
        return WORKFLOWS[name]()
    except KeyError:
        raise KeyError(f"unknown workflow '{name}' (known: {', '.join(sorted(WORKFLOWS))})") from None
