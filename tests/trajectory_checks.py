"""What the multi-turn engine tests check a trajectory with: a client that keeps every generation the engine
returned, and the check that an experience is exactly those calls' ids, call by call."""

from __future__ import annotations

import pytest

from operators.engine.client import EngineClient
from operators.engine.samples import Generation
from schemas.config import RolloutArgs
from schemas.task import Task


def multi_turn_task(workflow: str, repeat: int = 1, seed: int | None = None, **workflow_args) -> Task:
    """A task of the `multi` taskset ("12+7=", 8 tokens a reply) for a multi-turn workflow."""
    return Task(
        f"{workflow}/e0/0",
        taskset="multi",
        epoch=0,
        index=0,
        step=1,
        prompt="12+7=",
        truth="19",
        workflow=workflow,
        reward_fn="",
        repeat_times=repeat,
        workflow_args=workflow_args,
        rollout_args=RolloutArgs(max_tokens=8, seed=seed).model_dump(),
    )


class SpyClient(EngineClient):
    """The real engine client, keeping every generation the engine returned (to compare experiences with)."""

    def __init__(self, engine):
        super().__init__(engine)
        self.generations: list[Generation] = []

    async def chat(self, messages, sampling):
        self.generations.append(await super().chat(messages, sampling))
        return self.generations[-1]

    async def chat_turn(self, messages, sampling, history, budget=None):
        self.generations.append(await super().chat_turn(messages, sampling, history, budget))
        return self.generations[-1]


def check_exact(
    experience: dict, calls: list[tuple[list[int], list[int], list[float]]], tokenizer, inserted: list[str]
) -> None:
    """The experience is the calls' ids, as returned: the first prompt, then each call's inserted tokens
    (masked out, logprob 0, span k decoding to a text holding `inserted[k]` and ending with the generation
    prompt) and its sampled tokens."""
    assert experience["prompt_ids"] == calls[0][0]
    ids, mask, logprobs, spans = [], [], [], []
    for k, (prompt, response, lps) in enumerate(calls):
        if k:
            before = len(calls[0][0]) + len(ids)
            added = prompt[before:]
            assert prompt[:before] == [*calls[0][0], *ids]  # the prompt extends the trajectory exactly
            spans.append([len(ids), len(ids) + len(added)])
            ids, mask, logprobs = ids + added, mask + [False] * len(added), logprobs + [0.0] * len(added)
        ids, mask, logprobs = ids + response, mask + [True] * len(response), logprobs + lps
    assert experience["response_ids"] == ids and experience["action_mask"] == mask
    assert experience["logprobs"] == pytest.approx(logprobs)
    assert experience["inserted_spans"] == spans and experience["turns"] == len(calls)
    assert len(inserted) == len(spans)
    for (start, end), text in zip(spans, inserted, strict=True):
        decoded = tokenizer.decode(ids[start:end], skip_special_tokens=False)
        assert text in decoded and decoded.endswith("<|assistant|>")
    assert [v for v, m in zip(experience["token_versions"], mask, strict=True) if not m] == [-1] * sum(
        not m for m in mask
    )
