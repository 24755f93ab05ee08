"""Experience ops: advantage, filters, shaping and pass rate on whole task groups, before experiences are
written. Plugins import `register_op`, `ExperienceOpBase` and `OpArgs` from `operators.workflows`; importing
them from here, their first home, still works, with a DeprecationWarning naming the new import."""

from operators.rollout.moved import moved_names

__getattr__ = moved_names(
    "operators.ops",
    {
        "register_op": "operators.workflows",
        "ExperienceOpBase": "operators.workflows",
        "OpArgs": "operators.workflows",
    },
)
