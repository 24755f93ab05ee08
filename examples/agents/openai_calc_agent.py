"""`openai_calc_agent`: the `tool_math` task written as your own agent, on the official `openai` client.

This is the example of bringing your own agent in docs/workflows.md. It is loaded as any plugin is, with
`--plugin-dir examples/agents` (or `plugin_dirs` in a config: pipelines/openai_calc_agent.yaml), and needs
the engines' OpenAI API (`explorer.rollout_model.enable_openai_api: true`).

The loop is plain agent code: send the chat; if the reply calls the calculator (`<calc>EXPR</calc>`), post
the result as a `tool` message and ask again; otherwise the reply is the final answer, scored by
`math_accuracy`. rftflow records every call the client makes and turns the run into experiences from the
engine's own token ids (the tool messages masked out), so nothing here deals with tokens.
"""

from __future__ import annotations

import asyncio

from operators.workflows import (
    TOOL_SYSTEM_PROMPT,
    AgentWorkflow,
    MalformedAction,
    get_reward_fn,
    is_tool_call,
    register_workflow,
    tool_result,
)


@register_workflow("openai_calc_agent")
class OpenAICalcAgent(AgentWorkflow):
    """Chat, answer calculator calls with `tool` messages, score the final answer."""

    async def run_agent(self, task, client, model) -> dict[str, float]:
        args = task.rollout_args
        sampling = {
            "max_completion_tokens": args["max_tokens"],
            "temperature": args["temperature"],
            "top_p": args["top_p"],
        }
        messages = [
            {"role": "system", "content": TOOL_SYSTEM_PROMPT},
            {"role": "user", "content": task.prompt},
        ]
        calls = 0
        while True:  # `workflow_args.max_turns` (default 8) ends a run that never answers
            reply = await client.chat.completions.create(model=model, messages=messages, **sampling)
            text = reply.choices[0].message.content or ""
            if not is_tool_call(text):
                reward_fn = get_reward_fn("math_accuracy")
                scored = await asyncio.to_thread(reward_fn, text, task.truth)  # may run math-verify
                return {**scored, "tool_calls": float(calls), "called_tool": float(calls > 0)}
            calls += 1
            try:
                result = tool_result(text)  # the built-in calculator: ast-safe and bounded
            except MalformedAction as exc:
                result = f"error: {exc}"
            messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": result}]
