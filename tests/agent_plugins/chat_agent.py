"""A plugin agent for the tests, loaded as `--plugin-dir tests/agent_plugins` loads it: three turns on the
official `openai` client (plain, streamed, plain). `workflow_args.edit_history` makes it drop what was said
before its third call, so that prompt cannot extend the trajectory (a split); `record_to` names a file for
what the engine returned, call by call: the agent asks for the token ids and logprobs itself (the engine
records them either way, and returns them only to a caller that asks)."""

from __future__ import annotations

import json
from pathlib import Path

from operators.workflows import AgentWorkflow, register_workflow


@register_workflow("test_openai_agent")
class ChatAgent(AgentWorkflow):
    """Three turns with the official client: plain, streamed, plain; keeps what the engine returned."""

    async def run_agent(self, task, client, model):
        messages = [{"role": "user", "content": task.prompt}]
        seen = []
        shown = {"logprobs": True, "extra_body": {"return_token_ids": True}}
        for turn in range(3):
            if turn == 1:
                stream = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=8, stream=True, **shown
                )
                text, prompt_ids, ids, lps = "", None, [], []
                async for chunk in stream:
                    prompt_ids = getattr(chunk, "prompt_token_ids", None) or prompt_ids
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
                        ids += getattr(choice, "token_ids", None) or []
                        lps += [e.logprob for e in (choice.logprobs.content if choice.logprobs else [])]
            else:
                reply = await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=8, **shown
                )
                choice = reply.choices[0]
                text, prompt_ids, ids = choice.message.content, reply.prompt_token_ids, choice.token_ids
                lps = [e.logprob for e in choice.logprobs.content]
            seen.append([prompt_ids, ids, lps])
            if task.workflow_args.get("edit_history") and turn == 1:
                messages = messages[:1]  # the agent drops what was said: the next prompt cannot extend it
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "ok, go on"}]
        if "record_to" in task.workflow_args:
            Path(task.workflow_args["record_to"]).write_text(json.dumps(seen))
        return {"reward": 1.0, "turns_seen": float(len(seen))}
