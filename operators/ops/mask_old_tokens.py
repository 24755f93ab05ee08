"""`mask_old_tokens`: with partial rollout, train only on the tokens of an experience's newest version.

A generation cut by a weight sync goes on under the new weights, so its tokens can come from two or more
versions (`token_versions`). This op sets `action_mask` false on every sampled token older than the newest
version among the experience's sampled tokens, so the trainer learns from none of the older ones (their ids
stay, as context). Inserted tokens (version -1) are masked already; nothing is dropped.
"""

from __future__ import annotations

import pyarrow as pa

from operators.ops.groups import set_column
from operators.ops.registry import ExperienceOpBase, register_op
from schemas.experience_ops import MaskOldTokensArgs


def newest_only(mask: list[bool], versions: list[int]) -> list[bool]:
    """`mask` with the sampled tokens of versions older than the newest sampled one turned off."""
    sampled = [v for v, m in zip(versions, mask, strict=True) if m]
    newest = max(sampled, default=None)
    return [m and v == newest for m, v in zip(mask, versions, strict=True)]


@register_op("mask_old_tokens")
class MaskOldTokens(ExperienceOpBase):
    Args = MaskOldTokensArgs

    def __call__(self, experiences: pa.Table) -> pa.Table:
        masks = experiences.column("action_mask").to_pylist()
        versions = experiences.column("token_versions").to_pylist()
        masked = [newest_only(m or [], v or []) for m, v in zip(masks, versions, strict=True)]
        return set_column(
            experiences, "action_mask", pa.array(masked, experiences.schema.field("action_mask").type)
        )
