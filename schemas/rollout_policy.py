"""`explorer.over_rollout` and `explorer.dynamic_timeout`: how the explorer cuts the straggler tail.

Both keep Trinity-RFT's key names. Over-rollout ends a step's batch once most of its tasks are done, and a
dynamic timeout bounds each attempt by a multiple of the mean task time seen so far, so one slow task cannot
hold a step for `max_timeout`.
"""

from __future__ import annotations

from pydantic import Field

from schemas.config_base import MAX_SECONDS, Strict


class OverRolloutConfig(Strict):
    ratio: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="a batch's tasks of a step end once (1 - ratio) of them are done, plus `wait_after_min`;"
        " the rest are cancelled and recorded as skipped, never run again (0: wait for all)",
    )
    wait_after_min: float = Field(
        0.0,
        ge=0.0,
        le=MAX_SECONDS,
        description="seconds the last tasks may still finish in, once (1 - ratio) of them are done",
    )
    recycle: bool = Field(
        False,
        description="the tasks cut go on sampling, their output so far kept, and commit with the next step"
        " instead of being skipped (the last step's are skipped); best with `synchronizer.partial_rollout`,"
        " else a sync waits for them",
    )


class DynamicTimeoutConfig(Strict):
    enable: bool = Field(False, description="bound each attempt by `ratio` x the mean task time so far")
    ratio: float = Field(
        3.0,
        gt=1.0,
        le=1000.0,
        description="the attempt timeout, as a multiple of the mean successful task time",
    )
    min_samples: int = Field(
        8, ge=1, le=100_000, description="successful tasks seen (per forwarder) before the bound applies"
    )
