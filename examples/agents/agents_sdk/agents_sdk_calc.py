"""`agents_sdk_calc` and `agents_sdk_calc_chat`: the `tool_math` task as an OpenAI Agents SDK agent.

The worked example of a framework agent in docs/workflows.md: an `Agent` with a `@function_tool` calculator,
run by the SDK's own `Runner`. `agents_sdk_calc` uses the SDK's default model class, `OpenAIResponsesModel`
(the Responses API); `agents_sdk_calc_chat` the same agent on `OpenAIChatCompletionsModel` (Chat
Completions). Both are handed rftflow's ready client, so every call goes to the engine under the run's
session and the engine records it; rftflow builds the experiences from the engine's own token ids (the
tool results masked out), so nothing here deals with tokens. A reply the SDK will not take (on the Responses
API, one cut at `max_tokens` is `incomplete`, and the SDK raises `ModelBehaviorError`) ends the run as an
answer that is not there: reward 0, the reply recorded as sampled, not a failed task.

Needs the `agents` extra (`pip install -e .[agents]`), `explorer.rollout_model.enable_openai_api` and
`tool_call_parser: hermes` on a model that calls tools Hermes-style (the bundled `tiny-fc-llama`):
pipelines/agents_sdk_calc.yaml. The SDK's tracing (which posts to api.openai.com) is off, and neither the
client nor the SDK's runner retries: a failed call fails the run, as rftflow's own retry policy decides.
"""

from __future__ import annotations

import asyncio
import json

from agents import (
    Agent,
    ModelBehaviorError,
    ModelRetrySettings,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    ToolCallItem,
    function_tool,
    set_tracing_disabled,
)

from operators.workflows import AgentWorkflow, call_result, call_reward, get_reward_fn, register_workflow

set_tracing_disabled(True)  # the SDK's traces would go to api.openai.com
RUNNER_TURNS = 64  # above any run's `workflow_args.max_turns`: the engine holds the run's own limit


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.

    Args:
        expression: for example 47 * 83
    """
    return call_result("calculator", json.dumps({"expression": expression}))


@register_workflow("agents_sdk_calc")
class AgentsSdkCalc(AgentWorkflow):
    """The calculator agent on the Responses API, the SDK's default."""

    model_class = OpenAIResponsesModel

    async def run_agent(self, task, client, model) -> dict[str, float]:
        args = task.rollout_args
        settings = ModelSettings(
            temperature=args["temperature"],
            top_p=args["top_p"],
            max_tokens=args["max_tokens"],
            retry=ModelRetrySettings(max_retries=0),
        )
        agent = Agent(
            name="calculator agent",
            tools=[calculator],
            model=self.model_class(model=model, openai_client=client),
            model_settings=settings,
        )
        try:
            result = await Runner.run(agent, task.prompt, max_turns=RUNNER_TURNS)
            text, items = str(result.final_output or ""), result.new_items
        except ModelBehaviorError as exc:  # a reply the SDK refuses, such as one cut at max_tokens
            text, items = "", exc.run_data.new_items if exc.run_data else []  # no answer: the run scores 0
        reward_fn = get_reward_fn(task.reward_fn or "math_accuracy")
        scored = await asyncio.to_thread(call_reward, reward_fn, text, task)  # may run math-verify
        calls = sum(isinstance(item, ToolCallItem) for item in items)
        return {**scored, "tool_calls": float(calls), "called_tool": float(calls > 0)}


@register_workflow("agents_sdk_calc_chat")
class AgentsSdkCalcChat(AgentsSdkCalc):
    """The same agent on Chat Completions."""

    model_class = OpenAIChatCompletionsModel
