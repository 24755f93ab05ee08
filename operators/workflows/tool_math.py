"""`tool_math`: arithmetic with a calculator tool, so a multi-turn rollout has a real decision in it.

The assistant either answers at once (`<answer>…</answer>`) or writes `<calc>EXPR</calc>` and stops. A call
is answered by a `tool` message holding the calculator's result (`operators.workflows.calculator`: ast-safe
and bounded), or `error: …` for a call it cannot compute, and the assistant goes on. The first reply without
a call is the final answer, scored by the task's reward function (`math_accuracy` by default). On the
bundled `tool_arith` tasks (two-digit times two-digit) the tiny tool model is mostly wrong in its head and
right with the calculator, so the reward depends on the decision to call it, which RL can then learn.

The run records as reward parts those of the reward function (`accuracy`; none when the run never answers,
its reward then 0), `tool_calls` (calls made, malformed ones included) and `called_tool` (1 when it made any:
its mean over runs is the tool-call rate).
"""

from __future__ import annotations

import asyncio
import re

from operators.rollout.reward_registry import call_reward, get_reward_fn
from operators.workflows.base import register_workflow
from operators.workflows.calculator import CalculatorError, calculate
from operators.workflows.env import EnvWorkflow, MalformedAction
from schemas.task import Task

TOOL_SYSTEM_PROMPT = "Calculator: <calc>EXPR</calc>"
DEFAULT_REWARD_FN = "math_accuracy"
CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)


def is_tool_call(reply: str) -> bool:
    """Whether the reply calls the calculator (well-formed or not) rather than giving its final answer."""
    return CALL_OPEN in reply


def tool_result(reply: str) -> str:
    """The calculator's answer to the reply's first `<calc>…</calc>`; `MalformedAction` when there is none
    (an unclosed tag) or the calculator refuses the expression, with a message that says why."""
    match = CALL.search(reply)
    if match is None:
        raise MalformedAction("<calc> without </calc>: write <calc>expression</calc>")
    try:
        return calculate(match.group(1))
    except CalculatorError as exc:
        raise MalformedAction(f"calculator: {exc}") from None


def first_prompt(task: Task) -> str:
    """The user message a run opens with: the prompt, or the last message of a chat task."""
    return task.prompt if task.prompt is not None else task.messages[-1]["content"]


class CalculatorEnv:
    """One run: counts the calls, answers them, scores the final answer."""

    def __init__(self, task: Task):
        self.task = task
        self.calls = 0
        self.scored: dict[str, float] = {}  # the reward function's parts, once the run answers

    def reset(self, task: Task) -> str:
        return first_prompt(task)

    async def step(self, action_text: str) -> tuple[str, float, bool]:
        if is_tool_call(action_text):
            self.calls += 1
            return tool_result(action_text), 0.0, False
        reward_fn = get_reward_fn(self.task.reward_fn or DEFAULT_REWARD_FN)
        # math-verify may run (answers that are not plain numbers): off the event loop, as single-turn does
        self.scored = await asyncio.to_thread(call_reward, reward_fn, action_text, self.task)
        return "", float(self.scored["reward"]), True

    def parts(self) -> dict[str, float]:
        scored = {k: float(v) for k, v in self.scored.items() if k != "reward"}
        return {**scored, "tool_calls": float(self.calls), "called_tool": float(self.calls > 0)}


@register_workflow("tool_math")
class ToolMathWorkflow(EnvWorkflow):
    """Arithmetic with a calculator: tool results come back in `tool` messages."""

    observation_role = "tool"
    default_system_prompt = TOOL_SYSTEM_PROMPT

    def make_env(self, task: Task) -> CalculatorEnv:
        return CalculatorEnv(task)
