"""`command_agent`: an agent that runs as its own process (a coding or terminal agent, a script in another
language) and gets only a base URL and a key, as any OpenAI-speaking program does.

```yaml
workflow: command_agent
workflow_args:
  command: python my_agent.py --fast   # an argv list, or a string split as a shell would (no shell runs)
  timeout: 300                         # seconds for the whole run; default max_turns x call_timeout
```

The process runs with `OPENAI_BASE_URL`, `OPENAI_API_KEY` and `OPENAI_MODEL` in its environment (the run's
session: every call it makes with that key is recorded by the engine), and the task as JSON on its stdin
(`task_id`, `prompt`, `truth`, `info`, `workflow_args`). Its reward is its last stdout line when that is a
JSON object with `reward` (and any parts); otherwise the task's `reward_fn` scores that line as the answer.
A process that exits non-zero fails the run with its stderr's end. When the run ends, fails or times out,
the process's whole group is killed, so nothing it started outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
from typing import Any

from operators.rollout.reward_registry import call_reward, get_reward_fn
from operators.workflows.agent import AgentWorkflow, Endpoint
from operators.workflows.base import register_workflow
from operators.workflows.multi_turn import limits_of
from schemas.errors import TaskInputError
from schemas.task import Task

STDERR_TAIL = 2000  # characters of a failed process's stderr kept in the error


def command_of(task: Task) -> list[str]:
    command = task.workflow_args.get("command")
    if isinstance(command, str) and command.strip():
        return shlex.split(command)
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        return command
    raise TaskInputError(f"workflow_args.command is {command!r}: give a command, a string or a list")


def task_json(task: Task) -> bytes:
    fields = {"task_id": task.task_uid, "prompt": task.prompt, "truth": task.truth, "info": task.info}
    return json.dumps({**fields, "workflow_args": task.workflow_args}).encode()


def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the process's whole group: what it started dies with it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


@register_workflow("command_agent")
class CommandAgentWorkflow(AgentWorkflow):
    """Runs `workflow_args.command` once per repeat, on the run's session."""

    async def run_agent(self, task: Task, client: Any, model: str, endpoint: Endpoint) -> Any:
        argv = command_of(task)
        limits = limits_of(task)
        timeout = float(task.workflow_args.get("timeout") or limits.max_turns * limits.call_timeout)
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **endpoint.env()},
            start_new_session=True,  # its own process group, killed whole
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(task_json(task)), timeout)
        except TimeoutError:
            past = f"ran past workflow_args.timeout={timeout:g}s"
            raise RuntimeError(f"the agent command {argv[0]!r} {past}") from None  # not the task's timeout
        finally:
            kill_group(process)
            if process.returncode is None:
                await process.wait()
        if process.returncode != 0:
            tail = err.decode(errors="replace")[-STDERR_TAIL:]
            raise RuntimeError(f"the agent command {argv[0]!r} exited with {process.returncode}: {tail}")
        return self.reward_of_output(task, out.decode(errors="replace"))

    @staticmethod
    def reward_of_output(task: Task, stdout: str) -> Any:
        """The last stdout line's JSON reward, or the task's reward function on that line."""
        lines = [line for line in stdout.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else ""
        try:
            parsed = json.loads(last)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and "reward" in parsed:
            return parsed
        if not task.reward_fn:
            raise TaskInputError(
                "the agent command printed no JSON reward on its last stdout line, and the task has no "
                "reward_fn"
            )
        return call_reward(get_reward_fn(task.reward_fn), last, task)
