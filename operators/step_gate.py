"""The step gate: tasks of a step start only once the driver has released that step.

The driver releases a whole period at a time (up to the next step after which a sync falls due), so steps
inside a period overlap freely while no task of the next period runs on weights older than its sync.
"""

from __future__ import annotations

import asyncio


class StepGate:
    """Plain class (testable in-process); `ray.remote(StepGate)` makes the named gate actor."""

    def __init__(self, released: int = 0):
        self.released = released
        self.changed = asyncio.Condition()

    async def wait(self, step: int) -> int:
        """Return once `step` is released; returns the released step so callers can skip later calls."""
        async with self.changed:
            await self.changed.wait_for(lambda: step <= self.released)
            return self.released

    async def release(self, upto: int) -> int:
        async with self.changed:
            self.released = max(self.released, upto)
            self.changed.notify_all()
            return self.released


class GateClient:
    """A forwarder's view of the gate: asks the actor only for steps beyond what it already knows is open."""

    def __init__(self, gate):
        self.gate = gate
        self.known = 0

    async def admit(self, step: int) -> None:
        if step > self.known:
            waiting = (
                self.gate.wait.remote(step) if hasattr(self.gate.wait, "remote") else self.gate.wait(step)
            )
            self.known = await waiting
