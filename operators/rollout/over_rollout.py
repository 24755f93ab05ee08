"""Over-rollout: stop waiting for a batch's last tasks of a step once most of them are done.

A step's tail is its slowest tasks, and with GRPO-style groups their samples add little that the finished
ones do not. Once `(1 - ratio)` of the sub-runs are done, the rest get `wait_after_min` seconds, then are
cancelled and reported as skipped: they are accounted for in the step, never run again, never written. The
condition holds per batch part, so it also holds for the whole step when Ray Data splits a step's tasks
over several batches.

With `recycle`, the cut tasks are not cancelled: the step records them as deferred (no experiences) and
commits without them, while they go on sampling, output so far kept, and report with the next step, which
waits for them. The last step has no next step: its tail is skipped as without `recycle`.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

SKIPPED = "skipped: over-rollout"  # the message prefix of a sub-run that over-rollout cut
DEFERRED = "deferred: over-rollout"  # ... of one it moved, still sampling, to the next step (`recycle`)


@dataclass(frozen=True)
class OverRollout:
    ratio: float = 0.0
    wait_after_min: float = 0.0
    recycle: bool = False

    def needed(self, n: int) -> int:
        """How many of `n` sub-runs must finish before the rest may be cut."""
        return n if self.ratio <= 0.0 else max(1, math.ceil((1.0 - self.ratio) * n))

    async def wait(self, runs: list[asyncio.Future], timeout: float | None) -> bool:
        """Wait for the runs until all are done, or `timeout` has passed, or enough are done and the grace
        period is over. True when it stopped with runs left for over-rollout's sake (they are skipped, not
        failed); the caller cancels whatever is still running either way."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        need, pending = self.needed(len(runs)), set(runs)
        while pending:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            if len(runs) - len(pending) >= need:
                grace = self.wait_after_min if left is None else min(self.wait_after_min, left)
                _, pending = await asyncio.wait(pending, timeout=grace) if grace > 0 else (set(), pending)
                return bool(pending) and (left is None or grace < left)
            _, pending = await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        return False
