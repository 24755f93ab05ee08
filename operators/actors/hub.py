"""The weight hub: a small named actor where a trainer announces new versions and the explorer finds them.

For `memory` the announcement carries the state dict's object ref (the tensors stay in the Ray object store
until an engine pulls them); for `broadcast` it carries the tensor list, and the tensors follow over the
torch.distributed group. The hub also holds the trainer's status (`trainer_status: actor:<hub name>` reads
it), the broadcast group's rendezvous offer, and how many engine workers will join that group.
"""

from __future__ import annotations

import asyncio
from typing import Any

TRAINER_STATES = ("running", "require_sync", "stopped")


class WeightHub:
    """Plain class (testable in-process); `ray.remote(WeightHub)` makes the named hub actor."""

    def __init__(self) -> None:
        self.version = 0
        self.payload: dict[str, Any] | None = None
        self.state = "unknown"
        self.offer: dict[str, Any] | None = None
        self.workers: int | None = None
        self.backend = "gloo"
        self.changed = asyncio.Condition()

    async def _set(self, **fields: Any) -> None:
        async with self.changed:
            for name, value in fields.items():
                setattr(self, name, value)
            self.changed.notify_all()

    async def _wait(self, ready, timeout: float) -> bool:
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(ready), timeout)
            except TimeoutError:
                return False
            return True

    # -- trainer side ------------------------------------------------------------------------------------

    async def publish(self, version: int, payload: dict[str, Any]) -> None:
        """Announce `version`: `{"kind": "memory", "state": [ref], "meta": m}` or `{"kind": "broadcast", …}`.

        `meta` lists `(name, shape, dtype)` per tensor (`operators.engine.transfer.meta_of`); a broadcast may
        add `bucket_bytes`, its bucket size (receivers must cut the same buckets).
        """
        async with self.changed:
            if version <= self.version:
                raise ValueError(f"version {version} is not newer than the published {self.version}")
            self.version, self.payload, self.state = version, payload, "require_sync"
            self.changed.notify_all()

    async def set_status(self, state: str) -> None:
        if state not in TRAINER_STATES:
            raise ValueError(f"trainer state must be one of {TRAINER_STATES}, got '{state}'")
        await self._set(state=state)

    async def offer_group(self, address: str, port: int) -> None:
        await self._set(offer={"master_address": address, "master_port": port})

    async def wait_workers(self, timeout: float) -> int | None:
        return self.workers if await self._wait(lambda: self.workers is not None, timeout) else None

    # -- explorer side -----------------------------------------------------------------------------------

    async def set_workers(self, workers: int, backend: str = "gloo") -> None:
        """How many engine workers join the broadcast group, and its backend (gloo on CPU, nccl on GPU)."""
        await self._set(workers=workers, backend=backend)

    def group_backend(self) -> str:
        return self.backend

    async def wait_newer(self, version: int, timeout: float) -> tuple[int, dict[str, Any]] | None:
        """The newest announcement above `version`; None after `timeout` or as soon as the trainer stops."""
        ready = await self._wait(lambda: self.version > version or self.state == "stopped", timeout)
        if ready and self.version > version:
            return self.version, self.payload
        return None

    def forget_state(self, version: int) -> None:
        """Every engine has loaded `version`: let the object store free its tensors."""
        if version == self.version and self.payload and self.payload.get("state"):
            self.payload = {**self.payload, "state": None}

    async def wait_offer(self, timeout: float) -> dict[str, Any] | None:
        return self.offer if await self._wait(lambda: self.offer is not None, timeout) else None

    def latest_version(self) -> int:
        return self.version

    def get_status(self) -> dict[str, Any]:
        """The trainer status that `pipelines.control.sync_policy.read_trainer_status` reads."""
        return {"state": self.state, "version": self.version}
