"""The experience-op registry and base class: plugins register ops as they register workflows.

An op is a class with an `Args` model (its arguments, `schemas.experience_ops.OpArgs`) whose instances are
called on an experience table (`EXPERIENCE_SCHEMA`) holding whole task groups, and return the rows they keep,
possibly with new `reward`, `advantage`, `reward_parts` or `info` values. The stage counts what each op
drops; an op never adds rows or changes keys (the stage checks).

    from operators.workflows import ExperienceOpBase, register_op

    @register_op("drop_truncated")
    class DropTruncated(ExperienceOpBase):
        def __call__(self, experiences):
            return experiences.filter(pc.not_equal(experiences.column("finish_reason"), "length"))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import pyarrow as pa

from operators.rollout.registration import import_all, lookup, register_once
from schemas.experience_ops import OpArgs, validate_args

BUILTIN_MODULES = (
    "operators.ops.advantage",
    "operators.ops.filters",
    "operators.ops.shaping",
    "operators.ops.pass_rate",
    "operators.ops.mask_old_tokens",
)


class ExperienceOp(Protocol):
    Args: ClassVar[type[OpArgs]]

    def __call__(self, experiences: pa.Table) -> pa.Table: ...


class ExperienceOpBase:
    """An op without arguments by default; `self.args` holds the validated `Args`."""

    Args: ClassVar[type[OpArgs]] = OpArgs

    def __init__(self, args: OpArgs):
        self.args = args

    def __call__(self, experiences: pa.Table) -> pa.Table:
        raise NotImplementedError


OPS: dict[str, type[ExperienceOp]] = {}


def check_op_class(cls: type) -> None:
    """Refuse at registration a class the stage could not build: it needs an `Args` model to validate."""
    args = getattr(cls, "Args", None)
    if not (isinstance(cls, type) and isinstance(args, type) and issubclass(args, OpArgs)):
        raise TypeError(
            f"experience op {getattr(cls, '__qualname__', cls)} needs an Args model (OpArgs); subclass "
            "ExperienceOpBase"
        )


def register_op(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        check_op_class(cls)
        register_once(OPS, "experience op", name, cls)
        return cls

    return wrap


def load_builtins() -> None:
    """Import the built-in ops, so they are registered before any plugin could take their names."""
    import_all(BUILTIN_MODULES)


def op_class(name: str) -> type[ExperienceOp]:
    load_builtins()
    return lookup(OPS, "experience op", name)


def build_op(name: str, args: dict[str, Any]) -> ExperienceOp:
    """The op `name` with `args` validated by its `Args` (a pydantic ValidationError under `args` if not)."""
    cls = op_class(name)
    return cls(validate_args(cls.Args, args))
