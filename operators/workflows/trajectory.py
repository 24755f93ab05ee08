"""Multi-turn trajectories from the calls an engine answered, token for token, never re-tokenized.

Each call is what the engine saw and sampled: its prompt ids, its response ids, their logprobs and the model
version at dispatch. In `merge` mode, while a call's prompt extends exactly the previous call's prompt and
response, the calls form one segment: the first prompt, then every sampled stretch (action mask true) with
the tokens inserted between calls (tool output, observations, template tokens: mask false, logprob 0, no
version). A prompt that does not extend the last one (the template re-rendered the history differently, or
the agent edited it) starts a new segment: a split. In `per_call` mode every call is its own segment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from schemas.experience import NOT_SAMPLED, Experience, task_experience
from schemas.task import Task

Mode = Literal["merge", "per_call"]
MODES = ("merge", "per_call")


@dataclass
class Call:
    """One engine call as sampled."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    model_version: int
    finish_reason: str
    token_versions: list[int] | None = (
        None  # None: every id sampled at `model_version` (else: partial rollout)
    )

    @property
    def versions(self) -> list[int]:
        return self.token_versions or [self.model_version] * len(self.response_ids)


@dataclass
class Segment:
    """One experience's worth of calls."""

    prompt_ids: list[int]
    split: bool = False  # begun because a prompt did not extend the one before (not the first segment)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    inserted_spans: list[tuple[int, int]] = field(default_factory=list)
    turns: int = 0
    finish_reason: str = ""

    @property
    def ids(self) -> list[int]:
        return [*self.prompt_ids, *self.response_ids]

    def extended_by(self, call: Call) -> bool:
        ids = self.ids
        return len(call.prompt_ids) >= len(ids) and call.prompt_ids[: len(ids)] == ids

    def add(self, call: Call) -> None:
        """Append `call` (whose prompt extends this segment): what it inserted, then what it sampled."""
        inserted = call.prompt_ids[len(self.ids) :]
        if inserted:
            start = len(self.response_ids)
            self.inserted_spans.append((start, start + len(inserted)))
            self.extend(inserted, [0.0] * len(inserted), False, [NOT_SAMPLED] * len(inserted))
        self.extend(call.response_ids, call.logprobs, True, call.versions)
        self.turns += 1
        self.finish_reason = call.finish_reason

    def extend(self, ids: list[int], logprobs: list[float], sampled: bool, versions: list[int]) -> None:
        self.response_ids += ids
        self.logprobs += logprobs
        self.action_mask += [sampled] * len(ids)
        self.token_versions += versions

    @property
    def model_version(self) -> int:
        """The oldest version any of its tokens was sampled with: staleness is judged on it."""
        sampled = [v for v, m in zip(self.token_versions, self.action_mask, strict=True) if m]
        return min(sampled) if sampled else 0


def assemble(calls: list[Call], mode: Mode = "merge") -> list[Segment]:
    """The segments of one run's calls, in order."""
    segments: list[Segment] = []
    for call in calls:
        if mode == "merge" and segments and segments[-1].extended_by(call):
            segments[-1].add(call)
            continue
        segment = Segment(list(call.prompt_ids), split=mode == "merge" and bool(segments))
        segment.add(call)
        segments.append(segment)
    return segments


def trajectory_mode(task: Task) -> Mode:
    """`workflow_args.trajectory`: `merge` (the default) or `per_call`."""
    mode = task.workflow_args.get("trajectory", "merge")
    if mode not in MODES:
        raise ValueError(f"workflow_args.trajectory is {mode!r}: give one of {', '.join(MODES)}")
    return mode


def segment_experiences(
    task: Task,
    run_id: int,
    segments: list[Segment],
    texts: list[tuple[str, str]],
    reward: float,
    parts: dict[str, float],
) -> list[Experience]:
    """One experience per segment, each with the run's reward; `texts`: each segment's (prompt, response)
    text, decoded by the engine."""
    experiences = []
    for index, (segment, (prompt_text, response_text)) in enumerate(zip(segments, texts, strict=True)):
        sampled = sum(segment.action_mask)
        metrics: dict[str, Any] = {
            "response_length": float(sampled),
            "turns": float(segment.turns),
            "trajectory_split": float(segment.split),
        }
        experiences.append(
            task_experience(
                task,
                run_id,
                model_version=segment.model_version,
                prompt_ids=segment.prompt_ids,
                response_ids=segment.response_ids,
                logprobs=segment.logprobs,
                reward=reward,
                reward_parts=dict(parts),
                prompt_text=prompt_text,
                response_text=response_text,
                finish_reason=segment.finish_reason,
                action_mask=segment.action_mask,
                metrics=metrics,
                segment=index,
                turns=segment.turns,
                token_versions=segment.token_versions,
                inserted_spans=segment.inserted_spans,
            )
        )
    return experiences
