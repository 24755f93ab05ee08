"""Workflows turn a task into experiences. What a plugin imports: `register_workflow` and the base classes
(`WorkflowBase` for a single call, `EnvWorkflow` for an in-process environment, `AgentWorkflow` for agent
code on the official OpenAI client)."""

from operators.workflows.agent import AgentWorkflow
from operators.workflows.env import EnvWorkflow, MalformedAction
from operators.workflows.registry import WorkflowBase, register_workflow

__all__ = ["AgentWorkflow", "EnvWorkflow", "MalformedAction", "WorkflowBase", "register_workflow"]
