"""`EnvWorkflow`: a gym-style environment driven in process, over the engine client (no HTTP).

A subclass says which environment a task gets (`make_env`). The environment:
- `reset(task) -> observation`: the first user message;
- `step(action_text) -> (observation, reward, done)`: the model's reply, answered;
- may raise `MalformedAction` for a reply it cannot act on (a malformed tool call): the run goes on with an
  error observation, as a real tool would answer. Any other exception fails the task with its message;
- may have `parts() -> dict[str, float]`: named figures of the run (tool calls made, say), read when it ends
  and recorded as the experience's reward parts, so they reach the metrics beside the reward.

Either method may be a coroutine. The workflow runs the chat loop: each later turn is the conversation so
far as token ids, plus only the new text tokenized (`VLLMEngine.chat_turn`), so every sampled id stays as
sampled. The run's reward is the sum of the step rewards.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, ClassVar, Protocol

from operators.engine.client import EngineClient, sampling_params
from operators.engine.seeds import derive_seed
from operators.workflows.multi_turn import Limits, MultiTurnWorkflow, RunResult
from operators.workflows.single_turn import task_messages
from operators.workflows.trajectory import Call
from schemas.task import Task


class MalformedAction(ValueError):
    """Raised by `step` for a reply it cannot act on; its message becomes the error observation."""


class Environment(Protocol):
    def reset(self, task: Task) -> Any: ...  # str, or a coroutine of one

    def step(self, action_text: str) -> Any: ...  # (observation, reward, done), or a coroutine of it


def env_parts(env: Environment) -> dict[str, float]:
    """The environment's named figures of the run, if it keeps any (its optional `parts()`)."""
    parts = getattr(env, "parts", None)
    return {name: float(value) for name, value in parts().items()} if callable(parts) else {}


async def settled(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class EnvWorkflow(MultiTurnWorkflow):
    """Subclass it, set `make_env`, and register it with `register_workflow`."""

    observation_role: ClassVar[str] = "user"  # the role the environment speaks in

    def make_env(self, task: Task) -> Environment:
        raise NotImplementedError(f"{type(self).__name__} must implement make_env(task)")

    async def run_once(self, task: Task, engine: EngineClient, run_id: int, limits: Limits) -> RunResult:
        env = self.make_env(task)
        first = await settled(env.reset(task))
        head = task_messages(task, self.default_system_prompt)[:-1]  # the system prompt, if any
        messages = [*head, {"role": "user", "content": str(first)}]
        calls: list[Call] = []
        total, history, finish = 0.0, None, None
        base_seed = task.rollout_args.get("seed")
        for turn in range(limits.max_turns):
            sampling = sampling_params(
                task.rollout_args, 1, derive_seed(base_seed, task.task_uid, run_id, turn)
            )
            if history is None:
                sampling["max_tokens"] = min(int(sampling.get("max_tokens") or 16), limits.budget - 1)
                request = engine.chat(messages, sampling)
            else:
                request = engine.chat_turn(messages, sampling, history, limits.budget)
            generation = await asyncio.wait_for(request, limits.call_timeout)
            if not generation.samples:  # no room left for a response
                finish = "length"
                break
            sample = generation.samples[0]
            calls.append(
                Call(
                    generation.prompt_ids,
                    sample.response_ids,
                    sample.logprobs,
                    generation.model_version,
                    sample.finish_reason,
                    sample.token_versions,
                )
            )
            history = [*generation.prompt_ids, *sample.response_ids]
            if len(history) >= limits.budget:
                finish = "length"
                break
            try:
                observation, reward, done = await settled(env.step(sample.text))
            except MalformedAction as exc:
                observation, reward, done = f"error: {exc}", 0.0, False
            total += float(reward)
            if done:
                break
            messages += [
                {"role": "assistant", "content": sample.text},
                {"role": self.observation_role, "content": str(observation)},
            ]
        return RunResult(calls, total, env_parts(env), finish)
