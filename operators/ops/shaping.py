"""`reward_shaping`: a length penalty and a format bonus, applied to a run's reward on all of its segments.

- Length: `length_penalty` per sampled token beyond `length_free_tokens`, the run's sampled tokens summed
  over its segments (tokens inserted between calls, e.g. tool output, are not the policy's and do not count).
- Format: `format_bonus` once per run when `format_pattern` is found (`re.search`) in the response text of
  any of its segments.

What each part changed is kept in `reward_parts` (`length_penalty` as the negative amount, `format_bonus`),
so the reward before shaping can always be recovered from the written row.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

from operators.ops.groups import groups_of, sampled_tokens, set_column
from operators.ops.registry import ExperienceOpBase, register_op
from schemas.experience_ops import RewardShapingArgs


@register_op("reward_shaping")
class RewardShaping(ExperienceOpBase):
    Args = RewardShapingArgs

    def __call__(self, experiences: pa.Table) -> pa.Table:
        args = self.args
        groups = groups_of(experiences)
        parts: dict[str, np.ndarray] = {}
        if args.length_penalty:
            tokens = np.bincount(
                groups.run_of_row, weights=sampled_tokens(experiences), minlength=groups.num_runs
            )
            over = np.maximum(tokens - args.length_free_tokens, 0)
            parts["length_penalty"] = -args.length_penalty * over
        if args.format_bonus:
            pattern = re.compile(args.format_pattern)
            texts = experiences.column("response_text").to_pylist()
            found = np.zeros(groups.num_runs, bool)
            for run, text in zip(groups.run_of_row, texts, strict=True):
                found[run] |= bool(text and pattern.search(text))
            parts["format_bonus"] = np.where(found, args.format_bonus, 0.0)
        if not parts:
            return experiences
        change = groups.rows(sum(parts.values()))
        reward = experiences.column("reward").to_numpy(zero_copy_only=False).astype(np.float64) + change
        shaped = set_column(experiences, "reward", pa.array(reward.astype(np.float32), pa.float32()))
        rows = {name: groups.rows(values) for name, values in parts.items()}
        old = experiences.column("reward_parts").to_pylist()
        merged = []
        for i, own in enumerate(old):
            row = dict(own or [])
            for name, values in rows.items():  # a second shaping op adds to the first one's part
                row[name] = row.get(name, 0.0) + float(values[i])
            merged.append(list(row.items()))
        return set_column(
            shaped, "reward_parts", pa.array(merged, experiences.schema.field("reward_parts").type)
        )
