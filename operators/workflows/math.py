"""`math`: a chat prompt, `repeat_times` samples in one request, each scored by the task's reward function."""

from __future__ import annotations

import asyncio
import logging

from operators.engine_client import EngineClient, derive_seed, sampling_params
from operators.rewards import get_reward_fn
from operators.workflows.registry import register_workflow
from schemas.experience import Experience
from schemas.task import Task

logging.getLogger("math_verify").setLevel(logging.ERROR)


def task_messages(task: Task) -> list[dict[str, str]]:
    if task.messages is not None:
        return task.messages
    system = task.workflow_args.get("system_prompt")
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": task.prompt}]


@register_workflow("math")
class MathWorkflow:
    async def run(self, task: Task, engine: EngineClient, run_id_base: int = 0) -> list[Experience]:
        n = task.repeat_times
        seed = derive_seed(task.rollout_args.get("seed"), task.task_uid, run_id_base)
        generation = await engine.chat(task_messages(task), sampling_params(task.rollout_args, n, seed))
        reward_fn = get_reward_fn(task.reward_fn)
        scores = await asyncio.to_thread(
            lambda: [reward_fn(s.text, task.truth, **task.reward_fn_args) for s in generation.samples]
        )
        return [
            Experience(
                task_uid=task.task_uid,
                run_id=run_id_base + i,
                step=task.step,
                taskset=task.taskset,
                model_version=generation.model_version,
                prompt_ids=generation.prompt_ids,
                response_ids=sample.response_ids,
                logprobs=sample.logprobs,
                reward=parts.pop("reward"),
                reward_parts=parts,
                prompt_text=generation.prompt_text,
                response_text=sample.text,
                truth=task.truth,
                finish_reason=sample.finish_reason,
                is_eval=task.is_eval,
                metrics={"response_length": float(len(sample.response_ids))},
            )
            for i, (sample, parts) in enumerate(zip(generation.samples, scores, strict=True))
        ]
