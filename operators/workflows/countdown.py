"""`countdown`: combine the given numbers with + - * / to reach a target; scored by the `countdown` reward.

The task's truth is JSON `{"target": T, "numbers": [a, b, ...]}`; `countdown_prompt` is the user prompt the
bundled taskset (pipelines/countdown_tasks.py) is written with.
"""

from __future__ import annotations

from operators.workflows.base import register_workflow
from operators.workflows.single_turn import SingleTurnWorkflow

COUNTDOWN_SYSTEM_PROMPT = "Think briefly, then give one equation in <answer></answer>."


def countdown_prompt(numbers: list[int], target: int) -> str:
    return (
        f"Using the numbers {numbers}, each exactly once, with + - * / and parentheses, make {target}. "
        "Put the equation in <answer></answer>, e.g. <answer>(1 + 2) * 3</answer>."
    )


@register_workflow("countdown")
class CountdownWorkflow(SingleTurnWorkflow):
    """Single turn: the equation uses exactly the task's numbers (`operators.rollout.rewards.countdown`)."""

    default_system_prompt = COUNTDOWN_SYSTEM_PROMPT
    default_reward_fn = "countdown"
