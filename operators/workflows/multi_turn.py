"""What every multi-turn workflow shares: its limits, its repeats run side by side, and its calls turned into
experiences (`operators.workflows.trajectory`).

A subclass implements `run_once(task, engine, run_id, limits)`, which returns the run's calls and its
reward; everything else is here. Limits come from `workflow_args`:
- `max_turns` (default 8): the most engine calls a run may make;
- `max_trajectory_tokens` (default: the engine's `max_model_len`): the most tokens a whole trajectory may
  hold; a run that fills it ends with finish reason `length`;
- `call_timeout` (default 60 s): the most one call may take;
- `trajectory`: `merge` (the default) or `per_call`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from operators.engine.client import EngineClient
from operators.workflows.base import WorkflowBase, repeats
from operators.workflows.trajectory import Call, assemble, segment_experiences, trajectory_mode
from schemas.errors import TaskInputError
from schemas.experience import Experience
from schemas.task import Task

DEFAULT_MAX_TURNS = 8
DEFAULT_CALL_TIMEOUT_S = 60.0
NO_BUDGET = 2**31 - 1  # no max_trajectory_tokens given: the engine's max_model_len is the limit


@dataclass(frozen=True)
class Limits:
    max_turns: int
    budget: int
    call_timeout: float


def positive(task: Task, key: str, default: float, kind: type) -> Any:
    value = task.workflow_args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskInputError(f"workflow_args.{key} is {value!r}: give a positive number")
    return kind(value)


def limits_of(task: Task) -> Limits:
    return Limits(
        max_turns=positive(task, "max_turns", DEFAULT_MAX_TURNS, int),
        budget=positive(task, "max_trajectory_tokens", NO_BUDGET, int),
        call_timeout=positive(task, "call_timeout", DEFAULT_CALL_TIMEOUT_S, float),
    )


@dataclass
class RunResult:
    """One run's calls, its reward (with any reward parts), and why it ended when a limit ended it."""

    calls: list[Call]
    reward: float
    parts: dict[str, float]
    finish_reason: str | None = None


def reward_of(result: Any) -> tuple[float, dict[str, float]]:
    """A float, or a dict with `reward` and any named parts."""
    if isinstance(result, dict):
        if "reward" not in result:
            raise ValueError(f"the run returned {sorted(result)} with no 'reward'")
        parts = {k: float(v) for k, v in result.items() if k != "reward"}
        return float(result["reward"]), parts
    if isinstance(result, bool) or not isinstance(result, int | float):
        raise TypeError(f"the run returned {type(result).__name__}, not a reward (a float or a dict)")
    return float(result), {}


class MultiTurnWorkflow(WorkflowBase):
    """Every repeat is its own run, all run side by side; each becomes one experience per segment."""

    resettable = True
    default_system_prompt: ClassVar[str | None] = None

    def reset(self, task: Task) -> None:
        """Nothing to reset: each run builds what it needs."""

    async def run_once(self, task: Task, engine: EngineClient, run_id: int, limits: Limits) -> RunResult:
        raise NotImplementedError

    async def run(
        self, task: Task, engine: EngineClient, run_id_base: int = 0, *, repeat_times: int | None = None
    ) -> list[Experience]:
        limits, mode = limits_of(task), trajectory_mode(task)
        run_ids = range(run_id_base, run_id_base + repeats(task, repeat_times))
        results = await asyncio.gather(*(self.run_once(task, engine, r, limits) for r in run_ids))
        experiences: list[Experience] = []
        for run_id, result in zip(run_ids, results, strict=True):
            if not result.calls:
                raise RuntimeError(f"run {run_id} made no call to the engine: nothing to learn from")
            segments = assemble(result.calls, mode)
            if result.finish_reason is not None:
                segments[-1].finish_reason = result.finish_reason
            texts = [
                (await engine.decode(s.prompt_ids), await engine.decode(s.response_ids)) for s in segments
            ]
            experiences += segment_experiences(task, run_id, segments, texts, result.reward, result.parts)
        return experiences
