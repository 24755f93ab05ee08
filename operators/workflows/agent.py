"""`AgentWorkflow`: agent code that talks to the engine over its OpenAI API, run once per repeat.

```python
@register_workflow("my_agent")
class MyAgent(AgentWorkflow):
    async def run_agent(self, task, client, model, endpoint) -> float:  # or {"reward": r, "<part>": v, ...}
        ...  # `client`: a ready `openai.AsyncOpenAI`; `endpoint`: base_url, api_key, model for any other
```

Each run opens a session on the engine its task was sent to (all turns of a run go to one engine, for the
prefix cache) and gets its key. The agent needs nothing else: the ready client holds the key, and an agent
that builds its own HTTP client (LangChain, httpx, another process) takes `endpoint.base_url`,
`endpoint.api_key` and `endpoint.model`. The engine records every call made with the key, on any admitted
route (chat, completions, responses, messages; streamed or not), as it sampled it, and the run collects them
in order when it ends (`operators.engine.sessions`). `run_agent(task, client, model)` without `endpoint`
works as well. The engine needs `explorer.rollout_model.enable_openai_api`.

A 400 from the engine (a prompt over the length rules, a request vLLM refuses) fails the task at once,
unretried: the same request would fail again. A run that passes `max_turns` or `max_trajectory_tokens` is cut
off by the engine, and ends there with reward 0 unless the agent returned one.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any

from operators.engine.client import EngineClient
from operators.workflows.multi_turn import Limits, MultiTurnWorkflow, RunResult, reward_of
from operators.workflows.trajectory import Call
from schemas.errors import TaskInputError
from schemas.task import Task

CLIENT_GRACE_S = 5.0  # the client waits this much past call_timeout, for the engine's own 408 to arrive
closing: set[asyncio.Task] = set()  # sessions of cancelled runs being ended (held so they are not collected)


@dataclass(frozen=True)
class Endpoint:
    """What an agent needs to reach the engine under its run's session: any OpenAI-speaking client works."""

    base_url: str
    api_key: str
    model: str

    def env(self) -> dict[str, str]:
        """The OpenAI SDKs' own environment variables for this endpoint."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key, "OPENAI_MODEL": self.model}


def takes_endpoint(fn: Any) -> bool:
    params = inspect.signature(fn).parameters.values()
    return any(p.name == "endpoint" or p.kind is p.VAR_KEYWORD for p in params)


def session_calls(record: dict[str, Any]) -> list[Call]:
    keep = ("prompt_ids", "response_ids", "logprobs", "model_version", "finish_reason")
    return [Call(**{k: c[k] for k in keep}) for c in record["calls"]]


class AgentWorkflow(MultiTurnWorkflow):
    """Subclass it, write `run_agent`, and register it with `register_workflow`."""

    async def run_agent(self, task: Task, client: Any, model: str, endpoint: Endpoint | None = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement run_agent(task, client, model)")

    async def run_once(self, task: Task, engine: EngineClient, run_id: int, limits: Limits) -> RunResult:
        url, model, _ = await engine.openai_endpoint()
        seed = task.rollout_args.get("seed")
        key = await engine.open_session(
            limits.max_turns, limits.budget, limits.call_timeout, seed, [task.task_uid, run_id]
        )
        try:
            failure, result = None, await self.run_in_session(task, Endpoint(url, key, model), limits)
        except Exception as exc:
            failure, result = exc, None
        except BaseException:  # cancelled (the task's timeout): the session ends with the run
            ending = asyncio.ensure_future(engine.close_session(key))
            closing.add(ending)
            ending.add_done_callback(closing.discard)
            raise
        record = await engine.collect_session(key)
        calls = session_calls(record)
        if record["stopped"] is not None and (failure is not None or result is None):
            return RunResult(calls, 0.0, {}, record["stopped"])
        if failure is not None:
            raise failure
        reward, parts = reward_of(result)
        return RunResult(calls, reward, parts, record["stopped"])

    async def run_in_session(self, task: Task, endpoint: Endpoint, limits: Limits) -> Any:
        """`run_agent` with a ready client on the session; the engine's 400 becomes the task's input error."""
        import openai  # heavy, deferred: only agent workflows use the official client

        timeout = limits.call_timeout + CLIENT_GRACE_S
        async with openai.AsyncOpenAI(
            base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0, timeout=timeout
        ) as client:
            extra = {"endpoint": endpoint} if takes_endpoint(self.run_agent) else {}
            try:
                return await self.run_agent(task, client, endpoint.model, **extra)
            except openai.BadRequestError as exc:
                raise TaskInputError(f"the engine refused a request: {exc.message}") from None
