"""A STAND-IN for a vLLM engine actor, for benchmarks of everything around the engines (not a test double of
vLLM's behaviour, and never used by the product): it answers every request after a fixed delay with a fixed
prompt and `n` samples of a fixed number of tokens, so the driver, the step gate, the forwarders and the sink
carry the payload a real engine would give them while no GPU, model or tokenizer is involved.

It has the engine actor's methods that a run without weight syncs calls (`ready`, `health`, `counters`,
`abort_older_than`, `chat`, `generate`, `shutdown`, and the batches of `chat` and `generate` forwarders send:
`serve`, `cancel_calls`), with the same result layout as
`operators.engine.actor.VLLMEngine`, and plugs in through `EngineFleet(..., launch=...)`, the fleet's own
injection point, under the engine's name: forwarders find it by name as they find a real engine.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from operators.engine.call_batches import ServesCallBatches
from operators.engine.samples import Generation, Sample

STAND_IN_TEXT = "The answer is 42."  # scored by the task's own reward function, as a real response would be


@dataclass(frozen=True)
class StandInShape:
    """What every answer looks like: its delay and its token counts."""

    delay_s: float  # from a request's arrival to its answer
    prompt_tokens: int  # the prompt ids it reports
    response_tokens: int  # tokens in each of the `n` samples


class StandInEngine(ServesCallBatches):
    """Answers after `shape.delay_s` with `n` samples of `shape.response_tokens` tokens (see the module doc).

    Any number of requests may wait at once: it stands for an engine that is never the bottleneck, so a
    benchmark measures what feeds it.
    """

    def __init__(self, shape: StandInShape):
        self.shape = shape
        self.prompt_ids = [i % 32000 for i in range(shape.prompt_tokens)]
        self.response_ids = [(7 * i + 3) % 32000 for i in range(shape.response_tokens)]
        self.logprobs = [-0.5] * shape.response_tokens
        self.answers: dict[int, dict[str, Any]] = {}  # by `n`: built once, as fixed answers can be
        self.requests = 0
        self.first_request_at: float | None = None  # wall clock (time.time()), for the benchmark's window
        self.in_flight = 0
        self.busy_s, self.busy_since = 0.0, 0.0

    async def ready(self) -> dict[str, Any]:
        return {"model_path": "stand-in", "model_version": 0, "pid": os.getpid(), "openai_url": None}

    async def health(self) -> dict[str, Any]:
        return {"model_version": 0, "in_flight": self.in_flight}

    def counters(self) -> dict[str, float]:
        """As the engine's: seconds with a request in flight, and (never) wasted tokens; plus its requests."""
        busy = self.busy_s + (time.monotonic() - self.busy_since if self.in_flight else 0.0)
        return {"busy_s": busy, "wasted_tokens": 0.0, "stand_in_requests": float(self.requests)}

    async def abort_older_than(self, version: int) -> int:
        return 0  # no weight syncs in a stand-in run: nothing is ever older than the current version

    def first_request(self) -> float | None:
        """When the first request arrived (time.time()), None before any: where the stream's work began."""
        return self.first_request_at

    def get_model_version(self) -> int:
        return 0

    def openai_endpoint(self) -> None:
        return None  # serves no OpenAI API: agent workflows are not for the stand-in

    async def chat(self, messages: list[dict[str, str]], sampling: dict[str, Any]) -> dict[str, Any]:
        return await self.answer(int(sampling.get("n") or 1))

    async def generate(
        self, prompt: Any, sampling: dict[str, Any], limit: int | None = None
    ) -> dict[str, Any]:
        return await self.answer(int(sampling.get("n") or 1))

    async def answer(self, n: int) -> dict[str, Any]:
        self.requests += 1
        self.first_request_at = self.first_request_at or time.time()
        if self.in_flight == 0:
            self.busy_since = time.monotonic()
        self.in_flight += 1
        try:
            await asyncio.sleep(self.shape.delay_s)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.busy_s += time.monotonic() - self.busy_since
        if n not in self.answers:
            sample = Sample(self.response_ids, self.logprobs, "length", STAND_IN_TEXT)
            self.answers[n] = asdict(Generation(self.prompt_ids, "stand-in prompt", 0, [sample] * n))
        return self.answers[n]

    async def shutdown(self) -> None:
        return None
