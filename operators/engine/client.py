"""What workflows call: one interface over an engine actor handle or an in-process engine."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

from operators.actors.names import find_actor
from operators.engine.actor import EngineGone
from operators.engine.call_batches import CallBatcher, ServesCallBatches
from operators.engine.samples import Generation, Sample

RETRY_POLL_S = 1.0  # how often a call to a lost engine looks for its replacement
# A replacement takes the name within seconds of the old actor's removal; a name unused for longer than this
# means the engines were stopped (the run ended), and waiting on would only hold up the stream's end.
ABSENT_S = 15.0


def sampling_params(rollout_args: dict[str, Any], n: int, seed: int | None) -> dict[str, Any]:
    """vLLM SamplingParams fields from a task's rollout_args."""
    keep = ("temperature", "top_p", "top_k", "max_tokens", "ignore_eos", "logprobs")
    params = {k: rollout_args[k] for k in keep if k in rollout_args}
    params.update(n=n, seed=seed)
    return params


class EngineClient:
    """Awaits an engine actor (cancelling the remote call if the caller is cancelled) or a local engine.

    Requests to an actor go in batches (`operators.engine.call_batches`): those made in the same turn of the
    event loop share one Ray call. An engine actor that dies, or whose vLLM core dies, is replaced under the
    same name by the driver's supervisor; a call that was in flight on it is sent again to the replacement
    (requests are seeded, so the answer is the one the lost call would have given), for up to
    `restart_timeout` seconds.
    """

    def __init__(self, engine: Any, name: str = "engine", restart_timeout: float = 600.0):
        self.engine = engine
        self.name = name
        self.restart_timeout = restart_timeout
        self.remote = engine is None or hasattr(engine.generate, "remote")
        self.batcher: CallBatcher | None = None
        self.finding: asyncio.Future | None = None  # the lookup in flight (`_look_up`)

    @classmethod
    def named(cls, name: str, restart_timeout: float = 600.0) -> EngineClient:
        """A client of the engine actor called `name`, looked up at its first call."""
        return cls(None, name=name, restart_timeout=restart_timeout)

    async def _call(self, method: str, *args: Any) -> Any:
        if not self.remote:
            result = getattr(self.engine, method)(*args)
            return await result if inspect.isawaitable(result) else result
        patience = Patience(self.name, self.restart_timeout)
        if self.engine is None:
            await self._look_up(None)
        while True:
            engine = self.engine
            if engine is None:
                patience.missing()
            else:
                try:
                    return await self._send(method, args)
                except Exception as exc:
                    if not engine_lost(exc):
                        raise
                    patience.lost(exc)
            await asyncio.sleep(RETRY_POLL_S)
            await self._look_up(engine)

    async def _look_up(self, stale: Any) -> None:
        """Find the actor under the name again, unless a concurrent caller already has since `stale` failed.
        The callers that saw the same loss share one lookup, and so one handle (one batcher), and wake
        together, so their requests go on travelling in one call."""
        if self.engine is not stale:
            return
        loop = asyncio.get_running_loop()
        if self.finding is None or self.finding.done() or self.finding.get_loop() is not loop:
            self.finding = asyncio.ensure_future(self._find())
        await asyncio.shield(self.finding)  # one caller's cancellation must not cancel the others' lookup

    async def _find(self) -> None:
        self.engine = await asyncio.to_thread(lookup_engine, self.name)

    async def _send(self, method: str, args: tuple) -> Any:
        """One attempt on the current actor handle; a cancelled attempt stops the engine's request."""
        if method in ServesCallBatches.batched_methods:
            if self.batcher is None or self.batcher.engine is not self.engine:  # a replacement: a new handle
                self.batcher = CallBatcher(self.engine)
            return await self.batcher.call(method, args)
        ref = getattr(self.engine, method).remote(*args)
        try:
            return await ref
        except asyncio.CancelledError:
            import ray  # heavy, deferred: the driver imports this module without Ray

            ray.cancel(ref)  # a timed-out attempt must not keep running
            raise

    async def chat(self, messages: list[dict[str, str]], sampling: dict[str, Any]) -> Generation:
        return to_generation(await self._call("chat", messages, sampling))

    async def generate(self, prompt: str | list[int], sampling: dict[str, Any]) -> Generation:
        return to_generation(await self._call("generate", prompt, sampling))

    async def chat_turn(
        self,
        messages: list[dict[str, Any]],
        sampling: dict[str, Any],
        history: list[int],
        budget: int | None = None,
    ) -> Generation:
        """The next turn of a conversation held as ids (see `VLLMEngine.chat_turn`)."""
        return to_generation(await self._call("chat_turn", messages, sampling, history, budget))

    async def decode(self, ids: list[int]) -> str:
        return await self._call("decode", ids)

    async def open_session(
        self, max_turns: int, budget: int, call_timeout: float, seed: int | None, run_key: list
    ) -> str:
        """A session on this engine for one agent run: its key (`operators.engine.sessions`)."""
        return await self._call("open_session", max_turns, budget, call_timeout, seed, run_key)

    async def collect_session(self, key: str) -> dict[str, Any]:
        """The session's calls in order, and the limit that stopped it, if one did; the session ends."""
        return await self._call("collect_session", key)

    async def close_session(self, key: str) -> None:
        await self._call("close_session", key)

    async def openai_endpoint(self) -> tuple[str, str, str | None]:
        """`(base URL, served model name, api key)` of this engine's OpenAI API; RuntimeError when it serves
        none."""
        endpoint = await self._call("openai_endpoint")
        if endpoint is None:
            raise RuntimeError(
                f"{self.name} serves no OpenAI API: set explorer.rollout_model.enable_openai_api=true"
            )
        return tuple(endpoint)


def to_generation(raw: dict[str, Any]) -> Generation:
    samples = [Sample(**s) for s in raw["samples"]]
    return Generation(raw["prompt_ids"], raw["prompt_text"], raw["model_version"], samples)


class Patience:
    """How long a call waits for a lost engine's replacement: `restart_timeout` from the first loss, but only
    `ABSENT_S` while no actor has the name at all (the engines were stopped, not replaced)."""

    def __init__(self, name: str, restart_timeout: float):
        self.name, self.restart_timeout = name, restart_timeout
        self.deadline: float | None = None
        self.absent: float | None = None

    def lost(self, reason: BaseException | str) -> None:
        """The engine failed the call (an actor had the name); raises EngineGone once patience runs out."""
        self.absent = None
        self._wait_on(reason)

    def missing(self) -> None:
        """No actor has the name now."""
        self.absent = self.absent or time.monotonic()
        if time.monotonic() - self.absent > ABSENT_S:
            stopped = f"no actor of that name for {ABSENT_S:g}s; the engines were stopped"
            raise EngineGone(f"{self.name}: {stopped}")
        self._wait_on("no actor of that name")

    def _wait_on(self, reason: BaseException | str) -> None:
        self.deadline = self.deadline or time.monotonic() + self.restart_timeout
        if time.monotonic() >= self.deadline:
            raise EngineGone(f"{self.name} did not come back within {self.restart_timeout:g}s: {reason}")


def engine_lost(exc: BaseException) -> bool:
    """The engine actor died or is unreachable, or its vLLM core died: not the request's fault."""
    from ray.exceptions import RayActorError  # heavy, deferred: imported without Ray

    return isinstance(exc, RayActorError | EngineGone)


def lookup_engine(name: str) -> Any:
    """The actor now registered under `name` (a replacement, once the supervisor has made it), or None."""
    return find_actor(name)
