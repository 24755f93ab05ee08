"""When a weight sync falls due, for Trinity-RFT's three sync styles.

- `fixed`: after `sync_offset` steps, every `sync_interval` steps.
- `dynamic_by_explorer`: once the explorer is `sync_interval` steps past its last sync.
- `dynamic_by_trainer`: when the trainer says it has a newer version ready. Its status comes from a JSON file
  or a named Ray actor; a stopped or silent trainer never makes the explorer wait.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TrainerState = Literal["running", "require_sync", "stopped", "unknown"]


@dataclass(frozen=True)
class TrainerStatus:
    state: TrainerState = "unknown"
    version: int = 0


def sync_due(
    style: str,
    step: int,
    *,
    interval: int,
    offset: int = 0,
    last_sync_step: int = 0,
    model_version: int = 0,
    trainer: TrainerStatus | None = None,
) -> bool:
    """Whether the explorer should sync after committing `step` (steps count from 1)."""
    if style == "fixed":
        return step > offset and (step - offset) % interval == 0
    if style == "dynamic_by_explorer":
        return step > offset and step - last_sync_step >= interval
    if style == "dynamic_by_trainer":
        return trainer is not None and trainer.state == "require_sync" and trainer.version > model_version
    raise ValueError(f"unknown sync_style '{style}'")


def read_trainer_status(source: str | None) -> TrainerStatus:
    """`{"state": ..., "version": N}` from a file or `actor:<name>`'s `get_status()`; unknown if absent."""
    if not source:
        return TrainerStatus()
    if source.startswith("actor:"):
        import ray  # heavy, deferred: the driver's modules import without Ray

        try:
            actor = ray.get_actor(source.removeprefix("actor:"))
            raw = ray.get(actor.get_status.remote(), timeout=10)
        except Exception:  # a trainer that is gone or hung must not stall exploration
            return TrainerStatus()
    else:
        try:
            raw = json.loads(Path(source).read_text())
        except (OSError, ValueError):
            return TrainerStatus()
    if not isinstance(raw, dict):  # a half-written or foreign file says nothing
        return TrainerStatus()
    state = raw.get("state", "unknown")
    if state not in ("running", "require_sync", "stopped"):
        state = "unknown"
    try:
        version = int(raw.get("version", 0))
    except (TypeError, ValueError):
        version = 0
    return TrainerStatus(state=state, version=version)


def release_boundary(
    method: str,
    style: str,
    *,
    latest_step: int,
    num_steps: int,
    interval: int,
    offset: int = 0,
    max_staleness: int | None = None,
    partial: bool = False,
) -> int:
    """The last step whose tasks may start now: up to and including the next step after which a sync is due.

    With partial rollout (`partial`) the period after that starts too: its generations sample through the
    current period's tail, and the sync cuts them and lets them go on under the new weights. Without it, they
    would sample wholly on weights the sync is about to replace, so they wait for it. Staleness counts such a
    continuation by its oldest token, sampled on the version the engines hold now (about `latest_step -
    offset`), and a step commits with the trainer as far as one version short of it; so with `max_staleness`
    the extra period reaches no further than `latest_step - offset + 1 + max_staleness` (with `sync_offset: 1`
    and `max_staleness: 1` that is no extra step at all: the offset has used the bound up).

    Without a weight source everything is released. `dynamic_by_trainer` cannot know its next sync ahead, so
    it is not gated by period. Admission by staleness caps every style with a weight source: a task more than
    `max_staleness + offset + 1` steps ahead of the last commit would commit on weights the trainer has left
    that many versions behind, so it does not start (what it would sample is dropped at commit anyway).
    """
    if method == "none":
        return num_steps
    upto = num_steps
    if style != "dynamic_by_trainer":
        upto = period_end = next_period_end(style, latest_step, num_steps, interval, offset)
        if partial:
            upto = next_period_end(style, period_end, num_steps, interval, offset)
            if max_staleness is not None:
                upto = min(upto, max(period_end, latest_step - offset + 1 + max_staleness))
    if max_staleness is not None:
        upto = min(upto, latest_step + max_staleness + offset + 1)
    return min(upto, num_steps)


def next_period_end(style: str, after: int, num_steps: int, interval: int, offset: int) -> int:
    """The first step past `after` that a sync is due after, the last sync having come after `after`
    (`num_steps` at the latest)."""
    upto = after + 1
    while upto < num_steps and not sync_due(
        style, upto, interval=interval, offset=offset, last_sync_step=after
    ):
        upto += 1
    return upto
