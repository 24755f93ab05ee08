"""The first home of `MathWorkflow` (`math`, now in `single_turn.py`), kept so that plugins written against
it still load: importing it from here is a DeprecationWarning naming `operators.workflows`."""

from operators.rollout.moved import moved_names

__getattr__ = moved_names("operators.workflows.math", {"MathWorkflow": "operators.workflows"})
