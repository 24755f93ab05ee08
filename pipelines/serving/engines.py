"""The engines as the serving front sees them: where each serves, how busy it is, whether it is loading new
weights, and the engine-side sessions the front's calls are recorded under.

A front session is pinned to one engine at its first call (the least loaded then), for the engine's prefix
cache; sessionless calls go to the least loaded engine each time, under that engine's own sessionless session.
Engines that are loading a new version are passed over while any other serves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NO_LIMIT = 2**31 - 1  # a served session's turns and tokens: the caller's, not a run's


@dataclass
class ServedEngine:
    index: int
    handle: Any
    url: str  # http://host:port/v1
    model: str
    sessionless_key: str
    in_flight: int = 0
    requests: int = 0
    loading: bool = False
    version: int = 0


class EnginePool:
    def __init__(self, handles: list[Any], call_timeout: float):
        self.handles = handles
        self.call_timeout = call_timeout
        self.engines: list[ServedEngine] = []

    async def start(self) -> None:
        """Each engine's endpoint and version, and a sessionless session on each."""
        self.engines = [await self.served(index, handle) for index, handle in enumerate(self.handles)]

    async def served(self, index: int, handle: Any) -> ServedEngine:
        url, model, _ = await handle.openai_endpoint.remote()
        key = await self.open_on(handle, ["sessionless", index])
        version = await handle.get_model_version.remote()
        return ServedEngine(index, handle, url, model, key, version=version)

    async def refresh(self, handles: list[Any]) -> list[int]:
        """Take the fleet's replacements of dead engines (a new actor, a new address): their indices."""
        replaced = [i for i, handle in enumerate(handles) if handle is not self.engines[i].handle]
        for index in replaced:
            self.engines[index] = await self.served(index, handles[index])
        for engine in self.engines:
            engine.version = await engine.handle.get_model_version.remote()
        return replaced

    def set_loading(self, index: int, loading: bool) -> None:
        """Called from the rolling update's thread: engine `index` is (no longer) loading weights."""
        self.engines[index].loading = loading

    async def open_on(self, handle: Any, run_key: list) -> str:
        return await handle.open_session.remote(NO_LIMIT, NO_LIMIT, self.call_timeout, None, run_key)

    def pick(self) -> ServedEngine:
        """The least loaded engine, passing over those loading weights while another serves."""
        serving = [e for e in self.engines if not e.loading] or self.engines
        return min(serving, key=lambda e: (e.in_flight, e.requests))

    async def open_session(self, engine: ServedEngine, session_id: str) -> str:
        return await self.open_on(engine.handle, ["serve", session_id])

    async def take(self, engine: ServedEngine, key: str, index: int) -> dict[str, Any]:
        """The finished call's record, from the engine that sampled it."""
        return await engine.handle.take_session_call.remote(key, index)

    async def close_session(self, engine: ServedEngine, key: str) -> None:
        await engine.handle.close_session.remote(key)

    @property
    def model(self) -> str:
        return self.engines[0].model
