"""The plugin API: every name a plugin file (`--plugin-dir`) uses, in one module.

- Registration: `register_workflow`, `register_reward`, `register_op`.
- Workflow bases: `WorkflowBase` (any workflow), `SingleTurnWorkflow` and `MathWorkflow` (one chat request,
  each sample scored by a reward function), `EnvWorkflow` (an in-process environment; `MalformedAction` is
  its answer to an action it cannot take) and `AgentWorkflow` (agent code on the official OpenAI client).
- Experience ops: `ExperienceOpBase`, `OpArgs` (an op's arguments), `EXPERIENCE_SCHEMA` (the table it sees).
- Taskset selectors: `SelectorBase` and `register_selector` (see docs/configuration.md, "Several tasksets and
  selectors").
- The types a plugin receives or returns: `Task`, `Experience`, `EngineClient`, `Generation`, `Sample`,
  `RewardFn`; and the built-ins it may reuse: `get_reward_fn` (a reward function by name), `call_reward` (one
  called on a response to a task, with the task's `info` if it takes one), the `tool_math` calculator
  (`TOOL_SYSTEM_PROMPT`, `is_tool_call`, `tool_result`) and its function-calling form (`CALCULATOR_TOOL`, the
  tool's schema for `tools=[...]`; `call_result`, a parsed call's answer).

Names imported from their earlier homes (`operators.rewards`, `operators.rollout.rewards`,
`operators.workflows.registry`, `operators.workflows.math`, `operators.ops`) still work, with a
DeprecationWarning naming this module.
"""

from operators.engine.client import EngineClient
from operators.engine.samples import Generation, Sample
from operators.ops.registry import ExperienceOpBase, register_op
from operators.rollout.reward_registry import RewardFn, call_reward, get_reward_fn, register_reward
from operators.tasks.selectors import SelectorBase, register_selector
from operators.workflows.agent import AgentWorkflow
from operators.workflows.base import WorkflowBase, register_workflow
from operators.workflows.env import EnvWorkflow, MalformedAction
from operators.workflows.single_turn import MathWorkflow, SingleTurnWorkflow
from operators.workflows.tool_math import TOOL_SYSTEM_PROMPT, is_tool_call, tool_result
from operators.workflows.tool_math_fc import CALCULATOR_TOOL, call_result
from schemas.experience import EXPERIENCE_SCHEMA, Experience
from schemas.experience_ops import OpArgs
from schemas.task import Task

__all__ = [
    "CALCULATOR_TOOL",
    "EXPERIENCE_SCHEMA",
    "TOOL_SYSTEM_PROMPT",
    "AgentWorkflow",
    "EngineClient",
    "EnvWorkflow",
    "Experience",
    "ExperienceOpBase",
    "Generation",
    "MalformedAction",
    "MathWorkflow",
    "OpArgs",
    "RewardFn",
    "Sample",
    "SelectorBase",
    "SingleTurnWorkflow",
    "Task",
    "WorkflowBase",
    "call_result",
    "call_reward",
    "get_reward_fn",
    "is_tool_call",
    "register_op",
    "register_reward",
    "register_selector",
    "register_workflow",
    "tool_result",
]
