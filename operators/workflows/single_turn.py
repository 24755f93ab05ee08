"""`SingleTurnWorkflow`: a chat prompt, all requested samples in one request (vLLM `n`), each scored by a
reward function. Where a task becomes experiences for every single-turn built-in; they differ only in their
default system prompt, default reward function and per-sample metrics. `math`, the plain one, is here too.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from operators.engine.client import EngineClient, sampling_params
from operators.engine.samples import Generation, Sample
from operators.engine.seeds import derive_seed
from operators.rollout.reward_registry import call_reward, get_reward_fn
from operators.workflows.base import WorkflowBase, register_workflow, repeats
from schemas.experience import Experience, task_experience
from schemas.task import Task


def task_messages(task: Task, default_system: str | None = None) -> list[dict[str, str]]:
    """The task's messages, or its prompt after a system prompt (workflow_args.system_prompt wins)."""
    if task.messages is not None:
        return task.messages
    system = task.workflow_args.get("system_prompt", default_system)
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": task.prompt}]


class SingleTurnWorkflow(WorkflowBase):
    """One chat request for `n` samples. Holds no per-task state, so an instance is reset for free."""

    resettable = True
    default_system_prompt: ClassVar[str | None] = None
    # Used when the task names no reward function (empty `reward_fn`); the task's choice always wins.
    default_reward_fn: ClassVar[str] = "math_accuracy"

    def reset(self, task: Task) -> None:
        """Nothing to reset: every `run` reads all it needs from its task."""

    def reward_fn_name(self, task: Task) -> str:
        return task.reward_fn or self.default_reward_fn

    def metrics(self, sample: Sample, parts: dict[str, float], reward: float) -> dict[str, float]:
        return {"response_length": float(len(sample.response_ids))}

    async def run(
        self, task: Task, engine: EngineClient, run_id_base: int = 0, *, repeat_times: int | None = None
    ) -> list[Experience]:
        n = repeats(task, repeat_times)
        seed = derive_seed(task.rollout_args.get("seed"), task.task_uid, run_id_base)
        messages = task_messages(task, self.default_system_prompt)
        generation = await engine.chat(messages, sampling_params(task.rollout_args, n, seed))
        reward_fn = get_reward_fn(self.reward_fn_name(task))
        scores = await asyncio.to_thread(
            lambda: [call_reward(reward_fn, s.text, task) for s in generation.samples]
        )
        return [
            self.experience(task, generation, sample, parts, run_id_base + i)
            for i, (sample, parts) in enumerate(zip(generation.samples, scores, strict=True))
        ]

    def experience(
        self, task: Task, generation: Generation, sample: Sample, parts: dict[str, Any], run_id: int
    ) -> Experience:
        parts = dict(parts)
        reward = float(parts.pop("reward"))
        return task_experience(
            task,
            run_id,
            model_version=generation.model_version,
            token_versions=sample.token_versions,
            prompt_ids=generation.prompt_ids,
            response_ids=sample.response_ids,
            logprobs=sample.logprobs,
            reward=reward,
            reward_parts=parts,
            prompt_text=generation.prompt_text,
            response_text=sample.text,
            finish_reason=sample.finish_reason,
            metrics=self.metrics(sample, parts, reward),
        )


@register_workflow("math")
class MathWorkflow(SingleTurnWorkflow):
    """The prompt as given (plus workflow_args.system_prompt), scored by the task's reward function."""
