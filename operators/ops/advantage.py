"""Group advantages, computed per run and written on each of its segments' `advantage`.

- `grpo_advantage`: the run's reward standardised within its task group, (r - mean) / (std + eps) with the
  sample standard deviation (or only r - mean, `std_normalize: false`).
- `rloo_advantage`: the run's reward minus the mean of the *other* runs of its group (leave-one-out), which
  is n / (n - 1) times r - mean.

A group of one, or one whose rewards all agree, carries no preference between its responses: its advantage
is exactly 0 (tested for equality, so float rounding in the mean cannot leak tiny values through the eps).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from operators.ops.groups import Groups, groups_of, set_column
from operators.ops.registry import ExperienceOpBase, register_op
from schemas.experience_ops import GrpoAdvantageArgs, RlooAdvantageArgs


def no_preference(groups: Groups) -> np.ndarray:
    """Per run: whether its group says nothing about which response is better."""
    return (groups.group_size() < 2) | groups.group_agrees()


def grpo_advantages(groups: Groups, std_normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """Per run: GRPO's group-standardised reward."""
    centred = groups.run_reward - groups.group_mean(groups.run_reward)
    if std_normalize:
        centred = centred / (groups.group_std(groups.run_reward, ddof=1) + eps)
    return np.where(no_preference(groups), 0.0, centred)


def rloo_advantages(groups: Groups) -> np.ndarray:
    """Per run: the reward minus the mean of the rest of its group."""
    size = groups.group_size()
    scale = size / np.maximum(size - 1, 1)
    advantage = scale * (groups.run_reward - groups.group_mean(groups.run_reward))
    return np.where(no_preference(groups), 0.0, advantage)


def with_advantages(experiences: pa.Table, groups: Groups, per_run: np.ndarray) -> pa.Table:
    values = pa.array(groups.rows(per_run).astype(np.float32), pa.float32())
    return set_column(experiences, "advantage", values)


@register_op("grpo_advantage")
class GrpoAdvantage(ExperienceOpBase):
    Args = GrpoAdvantageArgs

    def __call__(self, experiences: pa.Table) -> pa.Table:
        groups = groups_of(experiences)
        values = grpo_advantages(groups, self.args.std_normalize, self.args.eps)
        return with_advantages(experiences, groups, values)


@register_op("rloo_advantage")
class RlooAdvantage(ExperienceOpBase):
    Args = RlooAdvantageArgs

    def __call__(self, experiences: pa.Table) -> pa.Table:
        groups = groups_of(experiences)
        return with_advantages(experiences, groups, rloo_advantages(groups))
