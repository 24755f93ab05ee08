"""The first home of the workflow registry (now `base.py`), kept so that plugins written against it still
load: `register_workflow` and `WorkflowBase` imported from here are a DeprecationWarning naming
`operators.workflows`, the one module a plugin imports from."""

from operators.rollout.moved import moved_names

__getattr__ = moved_names(
    "operators.workflows.registry",
    {"register_workflow": "operators.workflows", "WorkflowBase": "operators.workflows"},
)
