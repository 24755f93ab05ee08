"""The config of the experience ops (`buffer.explorer_input.experience_ops`) and the built-ins' arguments.

Each entry is `{name: <op>, args: {...}}`. The built-ins' arguments are checked here, when the config loads,
so a typo fails with the file and the dotted key before anything starts; a plugin's op is only known once its
plugin is loaded, so its name and arguments are checked with the other plugin names (pipelines/control/
checks.py), by the same `validate_args`.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails

from schemas.config_base import MAX_INT32, Strict


class OpArgs(Strict):
    """An op's arguments: unknown keys and wrong types are refused. A plugin's `Args` subclasses it."""


class GrpoAdvantageArgs(OpArgs):
    std_normalize: bool = Field(
        True, description="divide by the group's sample standard deviation (false: only subtract the mean)"
    )
    eps: float = Field(1e-6, gt=0.0, le=1.0, description="added to the standard deviation")


class RlooAdvantageArgs(OpArgs):
    """Leave-one-out has nothing to tune."""


class RewardFilterArgs(OpArgs):
    min_reward: float | None = Field(None, description="drop runs whose reward is below this")
    max_reward: float | None = Field(None, description="drop runs whose reward is above this")

    @model_validator(mode="after")
    def _a_bound(self) -> RewardFilterArgs:
        if self.min_reward is None and self.max_reward is None:
            raise ValueError(
                "give min_reward, max_reward or both: without either the filter keeps everything"
            )
        if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
            raise ValueError(f"min_reward {self.min_reward} is above max_reward {self.max_reward}")
        return self


class RewardStdFilterArgs(OpArgs):
    threshold: float = Field(
        0.0, ge=0.0, description="drop a task's group when its rewards' standard deviation is at most this"
    )


class RewardShapingArgs(OpArgs):
    length_penalty: float = Field(
        0.0, ge=0.0, description="subtracted from the reward per sampled token beyond `length_free_tokens`"
    )
    length_free_tokens: int = Field(0, ge=0, le=MAX_INT32, description="sampled tokens free of the penalty")
    format_bonus: float = Field(0.0, description="added to the reward when the response matches the pattern")
    format_pattern: str | None = Field(
        None, description="a Python regular expression, searched in the run's response text"
    )

    @model_validator(mode="after")
    def _pattern(self) -> RewardShapingArgs:
        if self.format_bonus and self.format_pattern is None:
            raise ValueError("format_bonus needs a format_pattern to match responses against")
        if self.format_pattern is not None:
            try:
                re.compile(self.format_pattern)
            except re.error as exc:
                raise ValueError(f"format_pattern is not a regular expression: {exc}") from None
        return self


class PassRateArgs(OpArgs):
    threshold: float = Field(1.0, description="a run passes when its reward is at least this")


class MaskOldTokensArgs(OpArgs):
    """Which tokens count as old is fixed: those sampled before the newest version in their experience."""


BUILTIN_OP_ARGS: dict[str, type[OpArgs]] = {
    "grpo_advantage": GrpoAdvantageArgs,
    "rloo_advantage": RlooAdvantageArgs,
    "reward_filter": RewardFilterArgs,
    "reward_std_filter": RewardStdFilterArgs,
    "reward_shaping": RewardShapingArgs,
    "pass_rate": PassRateArgs,
    "mask_old_tokens": MaskOldTokensArgs,
}


def validate_args(model: type[OpArgs], args: dict[str, Any], title: str = "ExperienceOpConfig") -> OpArgs:
    """`args` as `model`; a refusal is re-raised with each location under `args`, so the error names the
    full key (`buffer.explorer_input.experience_ops.1.args.min_reward`)."""
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        details = [
            InitErrorDetails(type=e["type"], loc=("args", *e["loc"]), input=e["input"], ctx=e.get("ctx", {}))
            for e in exc.errors()
        ]
        raise ValidationError.from_exception_data(title, details) from None


class ExperienceOpConfig(Strict):
    """One op of the chain; ops run in the order listed."""

    name: str = Field(min_length=1, description="a built-in op or one a plugin registers")
    args: dict[str, Any] = Field({}, description="the op's arguments")

    @model_validator(mode="after")
    def _builtin_args(self) -> ExperienceOpConfig:
        if self.name in BUILTIN_OP_ARGS:
            validate_args(BUILTIN_OP_ARGS[self.name], self.args)
        return self
