"""What workflows call: one interface over an engine actor handle or an in-process engine."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from operators.engine import Generation, Sample


def derive_seed(base: int | None, *parts: object) -> int | None:
    """A per-request seed from the run's base seed, so a rerun of the same task samples the same responses."""
    if base is None:
        return None
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def sampling_params(rollout_args: dict[str, Any], n: int, seed: int | None) -> dict[str, Any]:
    """vLLM SamplingParams fields from a task's rollout_args."""
    keep = ("temperature", "top_p", "top_k", "max_tokens", "logprobs")
    params = {k: rollout_args[k] for k in keep if k in rollout_args}
    params.update(n=n, seed=seed)
    return params


class EngineClient:
    """Awaits an engine actor (cancelling the remote call if the caller is cancelled) or a local engine."""

    def __init__(self, engine: Any, name: str = "engine"):
        self.engine = engine
        self.name = name
        self.remote = hasattr(engine.generate, "remote")

    async def _call(self, method: str, *args: Any) -> dict[str, Any]:
        target = getattr(self.engine, method)
        if not self.remote:
            return await target(*args)
        ref = target.remote(*args)
        try:
            return await ref
        except asyncio.CancelledError:
            import ray

            ray.cancel(ref)  # a timed-out attempt must not keep generating
            raise

    async def chat(self, messages: list[dict[str, str]], sampling: dict[str, Any]) -> Generation:
        return to_generation(await self._call("chat", messages, sampling))

    async def generate(self, prompt: str | list[int], sampling: dict[str, Any]) -> Generation:
        return to_generation(await self._call("generate", prompt, sampling))


def to_generation(raw: dict[str, Any]) -> Generation:
    samples = [Sample(**s) for s in raw["samples"]]
    return Generation(raw["prompt_ids"], raw["prompt_text"], raw["model_version"], samples)
