"""The Task row: one per taskset row and epoch, the unit the rollout operator dispatches."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from schemas.errors import InputError

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])

TASK_SCHEMA = pa.schema(
    [
        ("task_uid", pa.string()),
        ("taskset", pa.string()),
        ("epoch", pa.int32()),
        ("index", pa.int64()),
        ("step", pa.int64()),
        ("prompt", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("truth", pa.string()),
        ("workflow", pa.string()),
        ("reward_fn", pa.string()),
        ("repeat_times", pa.int32()),
        ("rollout_args", pa.string()),
        ("workflow_args", pa.string()),
        ("reward_fn_args", pa.string()),
        ("is_eval", pa.bool_()),
        ("info", pa.string()),
    ]
)
JSON_COLUMNS = ("rollout_args", "workflow_args", "reward_fn_args", "info")  # dicts, stored as JSON text

ROLE_NAMES = ("system", "user", "assistant", "tool")


def make_task_uid(taskset: str, epoch: int, index: int) -> str:
    """Stable across runs, so resume and de-duplication can key on it."""
    return f"{taskset}/e{epoch}/{index}"


@dataclass
class Task:
    """A task as workflows see it; JSON-typed columns are decoded to dicts."""

    task_uid: str
    taskset: str
    epoch: int
    index: int
    step: int
    truth: str
    workflow: str
    reward_fn: str
    repeat_times: int = 1
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    rollout_args: dict[str, Any] = field(default_factory=dict)
    workflow_args: dict[str, Any] = field(default_factory=dict)
    reward_fn_args: dict[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    # The row's own data beyond prompt and answer (a scorer's metadata, say): given to a reward function that
    # declares an `info` parameter, and written to each experience as `info.task`.
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise InputError("a task needs exactly one of 'prompt' or 'messages'", field="prompt")
        if self.repeat_times < 1:
            raise InputError(f"must be >= 1, got {self.repeat_times}", field="repeat_times")

    def to_row(self) -> dict[str, Any]:
        row = {name: getattr(self, name) for name in TASK_SCHEMA.names}
        for name in JSON_COLUMNS:
            row[name] = json.dumps(row[name], sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        kwargs = {name: row[name] for name in TASK_SCHEMA.names}
        for name in JSON_COLUMNS:
            kwargs[name] = json.loads(kwargs[name] or "{}")
        return cls(**kwargs)


def tasks_to_table(tasks: list[Task]) -> pa.Table:
    return pa.Table.from_pylist([t.to_row() for t in tasks], schema=TASK_SCHEMA)


def tasks_from_table(table: pa.Table) -> list[Task]:
    return [Task.from_row(row) for row in table.to_pylist()]
