"""Benchmark stand-in (not a real task): the multi-turn benchmark's three turns as an OpenAI Agents SDK agent
on the Responses API, loaded with `plugin_dirs` as a user's own agent is. Its own folder, so the other paths'
plugins load without the `agents` extra.

A random model never writes a tool call by itself, so the turns are forced: `tool_choice: required` on turns
1 and 2 (vLLM holds it with structured outputs: the reply is one Hermes-style call), `none` on turn 3. The
tool, `observe`, takes no arguments and answers the benchmark's stand-in observation. The direct loop of
benchmarks/multi_turn.py forces its turns the same way, with `forced_call` here. The engine runs the `hermes`
tool parser (vLLM forces a call through the parser: a `<tool_call>` structural tag) with compact JSON
(`json_whitespace: false`), so the random model cannot fill a forced call with whitespace.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    ModelBehaviorError,
    ModelRetrySettings,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    set_tracing_disabled,
)

from operators.workflows import AgentWorkflow, register_workflow

set_tracing_disabled(True)  # the SDK's traces would go to api.openai.com
TURNS = 3
OBSERVATION = "Noted. Go on."  # as the stand-in environment's
TOOL = "observe"
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {},
    "required": [],
    "additionalProperties": False,
}


async def observe(context: Any, arguments: str) -> str:
    return OBSERVATION


OBSERVE = FunctionTool(
    name=TOOL,
    description="Look at the environment.",
    params_json_schema=PARAMETERS,
    on_invoke_tool=observe,
)


def forced_turn(history: str | list[Any]) -> bool:
    """Whether the next call must be a tool call: until `TURNS - 1` tool results are in the history."""
    if isinstance(history, str):  # the task's prompt alone: the first turn
        return True
    results = [i for i in history if isinstance(i, dict) and i.get("type") == "function_call_output"]
    return len(results) < TURNS - 1


class ForcedTurns(OpenAIResponsesModel):
    """The SDK's Responses model with the tool choice set per turn (the SDK's own setting is one per run)."""

    async def get_response(self, system_instructions, input, model_settings, *args, **kwargs):
        choice = "required" if forced_turn(input) else "none"
        settings = dataclasses.replace(model_settings, tool_choice=choice)
        return await super().get_response(system_instructions, input, settings, *args, **kwargs)


@register_workflow("bench_agents_sdk")
class AgentsSdkTurns(AgentWorkflow):
    """The three turns as an Agents SDK run: two forced `observe` calls, then a free reply."""

    @staticmethod
    def forced_call(tokenizer: Any) -> Any:
        """vLLM's structured outputs for a forced turn of this agent's requests (`tool_choice: required`, one
        call, the `hermes` parser), as its Responses API derives them: for a direct loop forcing the same."""
        from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
        from vllm.parser import ParserManager

        tool = {"type": "function", "name": TOOL, "parameters": PARAMETERS, "strict": True}
        request = ResponsesRequest(
            model="any", input="", tools=[tool], tool_choice="required", parallel_tool_calls=False
        )
        parser = ParserManager.get_parser(
            tool_parser_name="hermes", enable_auto_tools=True, tokenizer=tokenizer
        )
        return parser(tokenizer, request.tools).adjust_request(request).structured_outputs

    async def run_agent(self, task, client, model) -> float:
        args = task.rollout_args
        settings = ModelSettings(
            temperature=args["temperature"],
            top_p=args["top_p"],
            max_tokens=args["max_tokens"],
            parallel_tool_calls=False,
            retry=ModelRetrySettings(max_retries=0),
        )
        agent = Agent(
            name="fixed turns",
            tools=[OBSERVE],
            model=ForcedTurns(model=model, openai_client=client),
            model_settings=settings,
        )
        with contextlib.suppress(
            ModelBehaviorError
        ):  # a reply cut at max_tokens ends the run, as in the direct loop
            await Runner.run(agent, task.prompt, max_turns=TURNS)
        return 0.0
