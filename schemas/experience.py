"""The Experience row: what the trainer reads. One per (task, run, segment).

A single-turn run is one experience, segment 0. A multi-turn run is one experience per stretch of calls whose
prompts extend each other exactly (segment 0, 1, ... at each split), or one per call (`per_call`). Its
`response_ids` then hold the sampled tokens (`action_mask` true) and the tokens inserted between calls (tool
output, observations, template tokens: mask false, logprob 0, `token_versions` -1), and `inserted_spans`
lists the `[start, end)` of each inserted stretch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from schemas.task import Task

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
        ("segment", pa.int32()),
        ("turns", pa.int32()),
        ("token_versions", pa.list_(pa.int64())),
        ("inserted_spans", pa.list_(pa.list_(pa.int32()))),
    ]
)
KEY = ("task_uid", "run_id", "segment")  # what a sink holds exactly once
NOT_SAMPLED = -1  # the token version of a token the engine did not sample (inserted between calls)
# Columns added after run dirs were first written (multi-turn); an older row means one segment, one turn,
# every token sampled at its model_version, nothing inserted.
ADDED_COLUMNS = ("segment", "turns", "token_versions", "inserted_spans")


def single_turn_values(table: pa.Table, name: str) -> list[Any]:
    """What column `name` holds for rows written before it existed."""
    if name == "token_versions":
        versions, responses = table.column("model_version"), table.column("response_ids")
        return [[v] * len(r or ()) for v, r in zip(versions.to_pylist(), responses.to_pylist(), strict=True)]
    return [{"segment": 0, "turns": 1, "inserted_spans": []}[name]] * table.num_rows


def conform(table: pa.Table) -> pa.Table:
    """An experience table as `EXPERIENCE_SCHEMA` has it now: a column an older run dir lacks is filled with
    what it meant then (`single_turn_values`)."""
    for name in ADDED_COLUMNS:
        if name not in table.column_names:
            field = EXPERIENCE_SCHEMA.field(name)
            table = table.append_column(field, pa.array(single_turn_values(table, name), type=field.type))
    return table.select(EXPERIENCE_SCHEMA.names).cast(EXPERIENCE_SCHEMA)


def is_single_turn(table: pa.Table) -> bool:
    """Whether every row is what an older table (without `ADDED_COLUMNS`) can hold as it is."""
    return all(table.column(n).to_pylist() == single_turn_values(table, n) for n in ADDED_COLUMNS)


class MalformedExperience(ValueError):
    """An experience a trainer must never see (e.g. logprobs that do not line up with the response)."""


def make_uid(task_uid: str, run_id: int, segment: int = 0) -> str:
    """`task_uid/run_id`, and `/s<segment>` after it for the segments after the first (so an unsplit run
    keeps the uid it had before segments existed)."""
    return f"{task_uid}/{run_id}" + (f"/s{segment}" if segment else "")


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
    segment: int = 0
    turns: int = 1
    token_versions: list[int] | None = None  # None: every response token sampled at `model_version`
    inserted_spans: list[tuple[int, int]] = field(default_factory=list)

    @property
    def uid(self) -> str:
        return make_uid(self.task_uid, self.run_id, self.segment)

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
        if self.token_versions is not None and len(self.token_versions) != len(self.response_ids):
            raise MalformedExperience(f"{self.uid}: token_versions length differs from response_ids")
        if any(not 0 <= a < b <= len(self.response_ids) for a, b in self.inserted_spans):
            raise MalformedExperience(f"{self.uid}: an inserted span outside response_ids")

    def to_row(self) -> dict[str, Any]:
        row = {name: getattr(self, name) for name in EXPERIENCE_SCHEMA.names}
        if row["action_mask"] is None:
            row["action_mask"] = [True] * len(self.response_ids)
        row["reward_parts"] = list(self.reward_parts.items())
        row["metrics"] = json.dumps(self.metrics, sort_keys=True)
        row["info"] = json.dumps(self.info, sort_keys=True)
        if row["token_versions"] is None:
            row["token_versions"] = [self.model_version] * len(self.response_ids)
        row["inserted_spans"] = [list(span) for span in self.inserted_spans]
        return row


def task_experience(task: Task, run_id: int, **fields: Any) -> Experience:
    """An experience of run `run_id` of `task`: its keys, step, taskset, truth and eval flag come from the
    task, so every workflow fills them alike; the sampled side (ids, logprobs, reward, ...) is `fields`."""
    return Experience(
        task_uid=task.task_uid,
        run_id=run_id,
        step=task.step,
        taskset=task.taskset,
        truth=task.truth,
        is_eval=task.is_eval,
        **fields,
    )


def experiences_to_table(experiences: list[Experience]) -> pa.Table:
    return pa.Table.from_pylist([e.to_row() for e in experiences], schema=EXPERIENCE_SCHEMA)
