"""`AgentWorkflow`: agent code written against the official `openai` client, run once per repeat.

```python
@register_workflow("my_agent")
class MyAgent(AgentWorkflow):
    async def run_agent(self, task, client, model) -> float:  # or {"reward": r, "<part>": v, ...}
        ...
```

Each run gets its own `openai.AsyncOpenAI` on the endpoint of the engine its task was sent to (all turns of
a run go to one engine, for the prefix cache). The client records every call (`operators.workflows.
recording`) and keeps nothing of another run's. The engine needs `explorer.rollout_model.enable_openai_api`.

A 400 from the engine (a prompt over the length rules, a request vLLM refuses) fails the task at once,
unretried: the same request would fail again. A run stopped by `max_turns` or `max_trajectory_tokens`
ends there, with reward 0 unless the agent returned one.
"""

from __future__ import annotations

from typing import Any

from operators.engine.client import EngineClient
from operators.workflows.multi_turn import Limits, MultiTurnWorkflow, RunResult, reward_of
from operators.workflows.recording import Recorder, recording_client
from schemas.errors import TaskInputError
from schemas.task import Task


def stopped_by_limit(exc: BaseException, recorder: Recorder) -> bool:
    """Whether `exc` is the client reporting the recorder's own refusal (wrapped as a connection error)."""
    while exc is not None:
        if exc is recorder.stopped:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class AgentWorkflow(MultiTurnWorkflow):
    """Subclass it, write `run_agent`, and register it with `register_workflow`."""

    async def run_agent(self, task: Task, client: Any, model: str) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement run_agent(task, client, model)")

    async def run_once(self, task: Task, engine: EngineClient, run_id: int, limits: Limits) -> RunResult:
        import openai  # heavy, deferred: only agent workflows use the official client

        url, model, api_key = await engine.openai_endpoint()
        recorder = Recorder(task.rollout_args.get("seed"), limits.max_turns, limits.budget)
        client = recording_client(url, api_key, recorder, (task.task_uid, run_id), limits.call_timeout)
        try:
            result = await self.run_agent(task, client, model)
        except openai.BadRequestError as exc:
            raise TaskInputError(f"the engine refused a request: {exc.message}") from None
        except Exception as exc:
            if not stopped_by_limit(exc, recorder):
                raise
            return RunResult(recorder.recorded(), 0.0, {}, recorder.stopped.finish_reason)
        finally:
            await client.close()
        reward, parts = reward_of(result)
        finish = recorder.stopped.finish_reason if recorder.stopped is not None else None
        return RunResult(recorder.recorded(), reward, parts, finish)
