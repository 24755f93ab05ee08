"""Experience ops: advantage, filters, shaping and pass rate on whole task groups, before experiences are
written. What a plugin imports: `register_op`, `ExperienceOpBase` and `OpArgs` (for its arguments)."""

from operators.ops.registry import ExperienceOpBase, register_op
from schemas.experience_ops import OpArgs

__all__ = ["ExperienceOpBase", "OpArgs", "register_op"]
