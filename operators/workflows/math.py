"""`math`: the prompt as given, all samples in one request, each scored by the task's reward function."""

from __future__ import annotations

from operators.workflows.registry import register_workflow
from operators.workflows.single_turn import SingleTurnWorkflow


@register_workflow("math")
class MathWorkflow(SingleTurnWorkflow):
    """The prompt as given (plus workflow_args.system_prompt), scored by the task's reward function."""
