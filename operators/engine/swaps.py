"""`WeightSwaps`: how an engine takes new weights in place, without a restart (a mixin of `VLLMEngine`).

Every load runs inside a pause: new requests wait at admission, and requests in flight finish on the old
weights (or, with partial rollout's `preempt`, are cut and go on under the new ones), so no request runs on a
mix of versions. The loads themselves run in vLLM's workers (`operators.engine.worker_extension`).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from operators.engine.transfer import from_wire, stage_state_dict


class WeightSwaps:
    """The weight loads of `VLLMEngine`, which provides `llm`, `open`, `drained`, `in_flight`, `dispatched`,
    `hopeless`, `preempted`, `preemptions`, `model_version` and `base_scores` (`AdapterSwaps`)."""

    async def preempt(self) -> int:
        """Cut the direct requests in flight (partial rollout): each goes on after the swap from its ids."""
        cut = [rid for rid in self.dispatched if rid not in self.hopeless]
        if cut:
            self.preempted.update(cut)
            self.preemptions += len(cut)
            await self.llm.abort(cut)
        return len(cut)

    async def _swap(
        self, version: int, load: Callable[[], Awaitable[int]], preempt: bool = False, base: bool = True
    ) -> dict[str, float]:
        """Pause, let requests in flight finish (or cut them, with `preempt`), load, stamp the new version,
        resume; reports the pause. Requests over HTTP always finish: their callers hold what they sampled.
        `base`: the load replaces the base weights, so the base model's probe scores (`AdapterSwaps`) go."""
        paused = time.perf_counter()
        self.open.clear()
        try:
            cut = await self.preempt() if preempt else 0
            async with self.drained:
                await self.drained.wait_for(lambda: self.in_flight == 0)
            loaded = time.perf_counter()
            if base:
                self.base_scores.clear()
            nbytes = await load()
            self.model_version = version
        finally:
            self.open.set()
        now = time.perf_counter()
        timing = {"pause_s": now - paused, "load_s": now - loaded}
        return {"version": version, "bytes": nbytes, **timing, "preempted": cut}

    async def load_checkpoint(
        self, path: str, version: int, timeout: float | None = None, preempt: bool = False
    ) -> dict[str, float]:
        """Reload every weight in place from a Hugging Face directory (already checked by the caller)."""

        async def load() -> int:
            await self.llm.collective_rpc("rftflow_reload", timeout, args=(str(path),))
            return sum(p.stat().st_size for p in Path(path).glob("*.safetensors"))

        return await self._swap(version, load, preempt)

    async def load_state_dict(
        self,
        state: dict[str, Any] | list[Any],
        version: int,
        timeout: float | None = None,
        preempt: bool = False,
    ) -> dict[str, float]:
        """Reload from tensors handed over in memory: a state dict, or `[ref]` to one in the Ray object store.

        Before the pause, the tensors are fetched and staged as one safetensors file in shared memory (in a
        thread, so requests in flight keep streaming); the worker then maps that file. Sending them through
        vLLM's RPC instead would copy every byte four times inside the pause.
        """
        staged = await asyncio.to_thread(stage_state_dict, state)
        try:

            async def load() -> int:
                return (await self.llm.collective_rpc("rftflow_load_file", timeout, args=(str(staged),)))[0]

            return await self._swap(version, load, preempt)
        finally:
            shutil.rmtree(staged.parent, ignore_errors=True)

    async def open_weight_group(
        self, address: str, port: int, rank_offset: int, world_size: int, backend: str, timeout: float
    ) -> list[int]:
        """Join the trainer's broadcast group; this engine's workers take ranks from `rank_offset`."""
        args = (address, port, rank_offset, world_size, backend, timeout)
        return await self.llm.collective_rpc("rftflow_open_group", timeout, args=args)

    async def receive_weights(
        self,
        meta: list,
        version: int,
        timeout: float | None = None,
        bucket_bytes: int | None = None,
        preempt: bool = False,
    ) -> dict[str, float]:
        """Receive the trainer's bucketed broadcast of `meta`'s tensors (its bucket size) and load them."""
        args = (meta,) if bucket_bytes is None else (meta, bucket_bytes)

        async def load() -> int:
            return (await self.llm.collective_rpc("rftflow_receive", timeout, args=args))[0]

        return await self._swap(version, load, preempt)

    async def get_weight(self, name: str):
        """The tensor the engine holds under vLLM's parameter name, in the engine's dtype."""
        return from_wire((await self.llm.collective_rpc("rftflow_get", args=(name,)))[0])[1]
