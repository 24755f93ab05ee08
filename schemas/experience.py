"""The Experience row: what the trainer reads. One per (task, run)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

EXPERIENCE_SCHEMA = pa.schema(
    [
        ("uid", pa.string()),
        ("task_uid", pa.string()),
        ("run_id", pa.int32()),
        ("step", pa.int64()),
        ("taskset", pa.string()),
        ("model_version", pa.int64()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("action_mask", pa.list_(pa.bool_())),
        ("reward", pa.float32()),
        ("reward_parts", pa.map_(pa.string(), pa.float32())),
        ("advantage", pa.float32()),
        ("prompt_text", pa.string()),
        ("response_text", pa.string()),
        ("truth", pa.string()),
        ("finish_reason", pa.string()),
        ("is_eval", pa.bool_()),
        ("metrics", pa.string()),
        ("info", pa.string()),
    ]
)


class MalformedExperience(ValueError):
    """An experience a trainer must never see (e.g. logprobs that do not line up with the response)."""


def make_uid(task_uid: str, run_id: int) -> str:
    return f"{task_uid}/{run_id}"


@dataclass
class Experience:
    task_uid: str
    run_id: int
    step: int
    taskset: str
    model_version: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    reward: float
    prompt_text: str = ""
    response_text: str = ""
    truth: str = ""
    finish_reason: str = ""
    is_eval: bool = False
    action_mask: list[bool] | None = None
    reward_parts: dict[str, float] = field(default_factory=dict)
    advantage: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def uid(self) -> str:
        return make_uid(self.task_uid, self.run_id)

    def validate(self) -> None:
        """Refuse shapes a trainer would silently mis-train on."""
        if not self.response_ids:
            raise MalformedExperience(f"{self.uid}: empty response_ids")
        if len(self.logprobs) != len(self.response_ids):
            raise MalformedExperience(
                f"{self.uid}: {len(self.logprobs)} logprobs for {len(self.response_ids)} response tokens"
            )
        if self.action_mask is not None and len(self.action_mask) != len(self.response_ids):
            raise MalformedExperience(f"{self.uid}: action_mask length differs from response_ids")
        if not math.isfinite(self.reward):
            raise MalformedExperience(f"{self.uid}: reward is {self.reward}")

    def to_row(self) -> dict[str, Any]:
        row = {name: getattr(self, name) for name in EXPERIENCE_SCHEMA.names}
        if row["action_mask"] is None:
            row["action_mask"] = [True] * len(self.response_ids)
        row["reward_parts"] = list(self.reward_parts.items())
        row["metrics"] = json.dumps(self.metrics, sort_keys=True)
        row["info"] = json.dumps(self.info, sort_keys=True)
        return row


def experiences_to_table(experiences: list[Experience]) -> pa.Table:
    return pa.Table.from_pylist([e.to_row() for e in experiences], schema=EXPERIENCE_SCHEMA)
