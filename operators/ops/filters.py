"""Filters: what they drop is counted by the stage under `rollout/filtered/<op>` and never written.

- `reward_filter`: drops runs whose reward is below `min_reward` or above `max_reward` (bounds kept).
- `reward_std_filter`: drops whole groups whose rewards' (population) standard deviation is at most
  `threshold`; at the default 0 those are the groups whose rewards all agree, which teach a group-baselined
  policy gradient nothing (DAPO's dynamic sampling). A group of one agrees with itself, so it goes too.

Both judge runs, so a multi-turn run's segments stay or go together.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from operators.ops.groups import groups_of, keep_rows
from operators.ops.registry import ExperienceOpBase, register_op
from schemas.experience_ops import RewardFilterArgs, RewardStdFilterArgs


@register_op("reward_filter")
class RewardFilter(ExperienceOpBase):
    Args = RewardFilterArgs

    def __call__(self, experiences: pa.Table) -> pa.Table:
        groups = groups_of(experiences)
        # compared as float32, as rewards are stored: a bound of 0.3 then means the stored 0.3, not 0.3 + 1e-8
        reward, keep = groups.run_reward.astype(np.float32), np.ones(groups.num_runs, bool)
        if self.args.min_reward is not None:
            keep &= reward >= np.float32(self.args.min_reward)
        if self.args.max_reward is not None:
            keep &= reward <= np.float32(self.args.max_reward)
        return keep_rows(experiences, groups.rows(keep))


@register_op("reward_std_filter")
class RewardStdFilter(ExperienceOpBase):
    Args = RewardStdFilterArgs

    def __call__(self, experiences: pa.Table) -> pa.Table:
        groups = groups_of(experiences)
        flat = groups.group_agrees() | (groups.group_std(groups.run_reward, ddof=0) <= self.args.threshold)
        return keep_rows(experiences, groups.rows(~flat))
