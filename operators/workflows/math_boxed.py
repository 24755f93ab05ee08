"""`math_boxed`: asks for the final answer in `\\boxed{}` and scores it with `math_boxed_accuracy`."""

from __future__ import annotations

from operators.workflows.base import register_workflow
from operators.workflows.single_turn import SingleTurnWorkflow

BOXED_SYSTEM_PROMPT = "Solve the problem step by step. Put only the final answer in \\boxed{}."


@register_workflow("math_boxed")
class MathBoxedWorkflow(SingleTurnWorkflow):
    """For tasksets whose answers are LaTeX (competition math); override the prompt with system_prompt."""

    default_system_prompt = BOXED_SYSTEM_PROMPT
    default_reward_fn = "math_boxed_accuracy"
