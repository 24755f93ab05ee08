"""Benchmark stand-ins (not real tasks): an environment that answers every reply with the same observation
and ends after three turns, so every trajectory has real turns whatever the model writes; and an agent on
the official `openai` client that makes the same three turns. Loaded with `plugin_dirs`, as a user's own
workflows are."""

from __future__ import annotations

from operators.workflows import AgentWorkflow, EnvWorkflow, register_workflow

TURNS = 3
OBSERVATION = "Noted. Go on."


class FixedObservationEnv:
    """Stand-in environment: a fixed observation, no reward, done after `TURNS` replies."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, task) -> str:
        return task.prompt

    def step(self, action_text: str) -> tuple[str, float, bool]:
        self.steps += 1
        return OBSERVATION, 0.0, self.steps >= TURNS


@register_workflow("bench_fixed_env")
class FixedTurnsEnv(EnvWorkflow):
    def make_env(self, task) -> FixedObservationEnv:
        return FixedObservationEnv()


@register_workflow("bench_fixed_agent")
class FixedTurnsAgent(AgentWorkflow):
    """The same turns through the engine's OpenAI API, recorded by the engine under the run's session."""

    async def run_agent(self, task, client, model) -> float:
        args = task.rollout_args
        messages = [{"role": "user", "content": task.prompt}]
        for _ in range(TURNS):
            reply = await client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=args["max_tokens"],
                temperature=args["temperature"],
                top_p=args["top_p"],
            )
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": OBSERVATION},
            ]
        return 0.0
