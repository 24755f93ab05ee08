"""The step gate: tasks of a step start only once the driver has released that step, and report back here.

The driver releases a whole period at a time (up to the next step after which a sync falls due), so steps
inside a period overlap freely while no task of the next period runs on weights older than its sync.

Finished batches report their sink records through the gate rather than through Ray Data's output: Ray Data
packs a task's outputs into one block, so a step's records could sit behind a gated later step of the same
block, and the step that would release it could never commit.

Forwarders enlist here when they start, so the driver that owns the gate knows every actor of its stream and
can end them at shutdown, whatever state Ray Data's executor is in (a stream started behind a closed gate may
never have produced a batch).
"""

from __future__ import annotations

import asyncio

import pyarrow as pa


class StepGate:
    """Plain class (testable in-process); `ray.remote(StepGate)` makes the named gate actor."""

    def __init__(self, released: int = 0):
        self.released = released
        self.changed = asyncio.Condition()
        self.reports: list[pa.Table] = []
        self.reported = asyncio.Condition()
        self.enlisted: dict[str, object] = {}  # actor id (hex) -> handle of each forwarder that started
        self.fed: dict[int, pa.Table] = {}  # a scheduled run's task rows by step, as the driver draws them
        self.posted = asyncio.Condition()

    def enlist(self, actor_id: str, handle: object) -> None:
        self.enlisted[actor_id] = handle

    def forwarders(self) -> dict[str, object]:
        """Every forwarder that enlisted, by actor id: what a shutdown must end."""
        return dict(self.enlisted)

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

    async def post(self, tables: dict[int, pa.Table], committed: int) -> None:
        """A scheduled run's next steps' tasks (the driver draws them as feedback allows); the tasks of
        steps up to `committed` are dropped, as no read needs them again."""
        async with self.posted:
            self.fed.update(tables)
            for step in [s for s in self.fed if s <= committed]:
                del self.fed[step]
            self.posted.notify_all()

    async def tasks(self, step: int) -> pa.Table:
        """Step `step`'s tasks in a scheduled run, once the driver has posted them."""
        async with self.posted:
            await self.posted.wait_for(lambda: step in self.fed)
            return self.fed[step]

    async def report(self, records: pa.Table) -> None:
        async with self.reported:
            self.reports.append(records)
            self.reported.notify_all()

    async def collect(self, timeout: float) -> list[pa.Table]:
        """Every report so far (waiting up to `timeout` for the first); each is handed out once."""
        async with self.reported:
            try:
                await asyncio.wait_for(self.reported.wait_for(lambda: self.reports), timeout)
            except TimeoutError:
                return []
            reports, self.reports = self.reports, []
            return reports


class GateClient:
    """A forwarder's view of the gate: asks the actor only for steps beyond what it already knows is open."""

    def __init__(self, gate):
        self.gate = gate
        self.known = 0

    async def report(self, records: pa.Table) -> None:
        await (
            self.gate.report.remote(records)
            if hasattr(self.gate.report, "remote")
            else self.gate.report(records)
        )

    async def admit(self, step: int) -> None:
        if step > self.known:
            waiting = (
                self.gate.wait.remote(step) if hasattr(self.gate.wait, "remote") else self.gate.wait(step)
            )
            self.known = await waiting
