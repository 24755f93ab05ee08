"""`tool_math_fc`: the `tool_math` task by function calling, as agent frameworks call tools.

Each request carries `tools=[CALCULATOR_TOOL]`; the engine's OpenAI API, started with
`tool_call_parser: hermes`, turns a reply such as
`<tool_call>{"name": "calculator", "arguments": {"expression": "47 * 83"}}</tool_call>` into the reply's
`tool_calls`. Each call is answered by a `tool` message (with its `tool_call_id`) holding the calculator's
result, or `error: …`; the first reply without `tool_calls` is the final answer, scored by the task's reward
function (`math_accuracy` by default). A reply whose call vLLM's parser cannot read comes back as plain text
(a 200, the text as content, as vLLM's parser falls back), so it is the final answer too, as any framework
would take it: the run ends there and is recorded as sampled.

The bundled `tiny-fc-llama` writes its calls in exactly the text the parser re-serialises (`hermes_call`:
`json.dumps` with its default separators, `name` then `arguments`, nothing before the tag), so its chat
template's rendering of the history equals the sampled bytes and a run merges into one experience.

Reward parts: the reward function's, `tool_calls` (calls the parser read), `malformed_calls` (replies that
opened a call the parser could not read) and `called_tool` (1 when the run made any call, read or not).
Needs `explorer.rollout_model.enable_openai_api` and `tool_call_parser: hermes`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from operators.rollout.reward_registry import call_reward, get_reward_fn
from operators.workflows.agent import AgentWorkflow
from operators.workflows.base import register_workflow
from operators.workflows.calculator import CalculatorError, calculate
from operators.workflows.single_turn import task_messages
from operators.workflows.tool_math import DEFAULT_REWARD_FN
from schemas.task import Task

CALCULATOR = "calculator"
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": CALCULATOR,
        "description": "Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example 47 * 83"}},
            "required": ["expression"],
        },
    },
}
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"  # what vLLM's hermes parser looks for
CALL_PREFIX = '{"name": "calculator", "arguments": {"expression": "'  # one token of tiny-fc-llama
CALL_SUFFIX = '"}}'  # one token of tiny-fc-llama


def hermes_call(expression: str) -> str:
    """A calculator call as the model writes it, byte for byte what the chat template renders back from the
    parsed call (`json.dumps` with its default separators, as both vLLM's parser and `tojson` use)."""
    body = json.dumps({"name": CALCULATOR, "arguments": {"expression": expression}}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def call_result(name: str, arguments: str) -> str:
    """The tool message's content for one parsed call: the calculator's result, or `error: …` saying what
    to fix (an unknown tool, arguments without a string `expression`, an expression the calculator
    refuses)."""
    if name != CALCULATOR:
        return f"error: no tool named {name!r}; the tool is {CALCULATOR!r}"
    try:
        expression = json.loads(arguments).get("expression")
    except (ValueError, AttributeError):
        expression = None
    if not isinstance(expression, str):
        return 'error: give the arguments as {"expression": "..."}'
    try:
        return calculate(expression)
    except CalculatorError as exc:
        return f"error: calculator: {exc}"


def assistant_message(message: Any) -> dict[str, Any]:
    """The reply as the next request's history: its content and its calls, as the OpenAI format has them."""
    calls = [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.function.name, "arguments": call.function.arguments},
        }
        for call in message.tool_calls
    ]
    return {"role": "assistant", "content": message.content, "tool_calls": calls}


@register_workflow("tool_math_fc")
class ToolMathFCWorkflow(AgentWorkflow):
    """Arithmetic with a calculator called by function calling over the engine's OpenAI API."""

    def sampling(self, task: Task) -> dict[str, Any]:
        """The request's sampling fields, from the task's rollout arguments."""
        args = task.rollout_args
        return {
            "max_completion_tokens": args["max_tokens"],
            "temperature": args["temperature"],
            "top_p": args["top_p"],
        }

    async def run_agent(self, task: Task, client: Any, model: str) -> dict[str, float]:
        sampling = self.sampling(task)
        messages: list[dict[str, Any]] = list(task_messages(task))
        calls = malformed = 0
        while True:  # `workflow_args.max_turns` (default 8) ends a run that never answers
            reply = await client.chat.completions.create(
                model=model, messages=messages, tools=[CALCULATOR_TOOL], **sampling
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                text = message.content or ""
                malformed += TOOL_CALL_OPEN in text
                reward_fn = get_reward_fn(task.reward_fn or DEFAULT_REWARD_FN)
                scored = await asyncio.to_thread(call_reward, reward_fn, text, task)  # may run math-verify
                return {
                    **scored,
                    "tool_calls": float(calls),
                    "malformed_calls": float(malformed),
                    "called_tool": float(calls + malformed > 0),
                }
            calls += len(message.tool_calls)
            messages.append(assistant_message(message))
            for call in message.tool_calls:
                result = call_result(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
