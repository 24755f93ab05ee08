"""The inference engine: a long-lived actor that owns a vLLM `AsyncLLM`.

It lives outside Ray Data (pool actors are rebuilt silently and cannot be messaged), so the rollout operator
only forwards requests to it. The model version is read when a request is dispatched, never at completion.

Weights are swapped in place (no restart) by `operators.engine.worker_extension`, inside a pause: new requests
wait, and requests in flight finish on the old weights, so no request runs on a mix of versions. With partial
rollout (`preempt`), the swap cuts the direct requests in flight instead, and each goes on under the new
weights from its prompt plus what it had sampled (`operators.engine.samples`), its tokens stamped per version.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any

from operators.engine.adapter_swaps import AdapterSwaps
from operators.engine.call_batches import ServesCallBatches
from operators.engine.cpu_dtype import host_hint
from operators.engine.openai_server import OpenAIServer, start_server
from operators.engine.proc_stats import process_tree_memory
from operators.engine.prompts import Prompts
from operators.engine.samples import Draft, Generation
from operators.engine.sessions import SessionBook, SessionLimits
from operators.engine.swaps import WeightSwaps
from operators.engine.vllm_args import engine_args, engine_env, use_gpu
from schemas.engine_config import RolloutModelConfig
from schemas.errors import StaleRequest
from schemas.lora_config import LoraConfig

log = logging.getLogger(__name__)


class EngineGone(RuntimeError):
    """The engine can serve no more requests (its vLLM core died); the caller waits for its replacement."""


def node_id() -> str | None:
    """The Ray node (hex id) this engine runs on; None in a process without Ray (an in-process engine)."""
    import ray  # heavy, deferred: an in-process engine runs without Ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


WARM_UP_SAMPLES = 32  # enough to take the first-batch stall (`VLLMEngine.warm_up`) out of step 1


class VLLMEngine(ServesCallBatches, WeightSwaps, AdapterSwaps):
    """Plain class (usable in-process); `ray.remote(VLLMEngine)` makes it the engine actor, which forwarders
    send `chat`, `generate` and `chat_turn` requests in batches (`serve`, `cancel_calls`)."""

    def __init__(
        self,
        model_path: str,
        cfg: dict[str, Any],
        model_version: int = 0,
        closed: bool = False,
        lora: dict[str, Any] | None = None,
    ):
        """`closed`: hold requests until the first load (a replacement must first get the current weights);
        `lora`: the run's `model.lora`, which enables adapters (`AdapterSwaps`)."""
        rollout = RolloutModelConfig.model_validate(cfg)
        lora_cfg = None if lora is None else LoraConfig.model_validate(lora)
        gpu = use_gpu(rollout)
        os.environ.update(engine_env(rollout, gpu))
        from vllm import AsyncEngineArgs  # heavy, deferred: only the engine process imports vLLM
        from vllm.v1.engine.async_llm import AsyncLLM  # heavy, deferred: as above

        args = AsyncEngineArgs(
            model=str(model_path),
            worker_extension_cls="operators.engine.worker_extension.WeightWorker",
            **engine_args(rollout, gpu, lora_cfg),
        )
        self.llm = AsyncLLM.from_engine_args(args)
        if not gpu and (hint := host_hint(str(self.llm.model_config.dtype))):
            log.warning(hint)
        self.tokenizer = self.llm.get_tokenizer()
        self.model_path = str(model_path)
        self.model_version = model_version
        self.workers = rollout.tensor_parallel_size
        self.max_model_len = self.llm.model_config.max_model_len
        self.prompts = Prompts(
            self.tokenizer, self.max_model_len, rollout.max_prompt_tokens, rollout.prompt_overflow
        )
        self.open = asyncio.Event()
        if not closed:
            self.open.set()
        self.in_flight = 0
        self.busy_s, self.busy_since = 0.0, 0.0  # time with a request in flight: the fleet's idle ratio
        # request id -> version at dispatch, of direct requests in flight
        self.dispatched: dict[str, int] = {}
        self.hopeless: set[str] = set()  # ids aborted by `abort_older_than`
        self.preempted: set[str] = set()  # ids cut by a swap, to go on under the new weights
        self.preemptions = 0  # requests cut by swaps and continued (a running total, for the step metrics)
        self.wasted_tokens = 0  # tokens sampled by requests aborted as hopeless
        self.drained = asyncio.Condition()
        self.rollout = rollout
        self.server: OpenAIServer | None = None
        self.sessions = SessionBook()  # agent runs' HTTP calls, recorded by key (`operators.engine.sessions`)
        self.warming: asyncio.Future | None = None  # the warm-up request, made once (`ready`)
        self.adapter = None  # the LoRARequest every request samples with (`AdapterSwaps`); None: the base
        self.adapters_loaded = []
        self.base_scores = {}

    async def ready(self) -> dict[str, Any]:
        """The engine's identity, once its model is loaded, its first forward done (`warm_up`) and (when
        enabled) its OpenAI API up."""
        self.warming = self.warming or asyncio.ensure_future(self.warm_up())
        await asyncio.shield(self.warming)
        if self.rollout.enable_openai_api and self.server is None:
            self.server = await start_server(
                self.llm, self.rollout, self.model_path, self.rollout.port, self, lambda: self.adapter
            )
        return {
            "model_path": self.model_path,
            "model_version": self.model_version,
            "pid": os.getpid(),
            "node_id": node_id(),
            "openai_url": self.openai_url(),
        }

    async def warm_up(self) -> None:
        """One request of `WARM_UP_SAMPLES` seeded two-token samples, discarded, before the engine reports
        ready. On CPU vLLM's first forward costs seconds (2.6 s with a 113M model on 2 cores, where a batch of
        128 samples then takes about 3 s), and its first batch of many samples stalls a further 1.3 s with
        every process idle. Both belong to the engine's start: paid by step 1's tasks they slowed that step
        and inflated the mean task time the dynamic timeout is made of. Not gated, stamped or counted."""
        from vllm import SamplingParams  # heavy, deferred: only the engine process imports vLLM

        prompt = self.tokenizer.encode("warm-up", add_special_tokens=True) or [0]
        params = SamplingParams(n=WARM_UP_SAMPLES, max_tokens=2, temperature=1.0, seed=0, logprobs=0)
        async for _ in self.llm.generate({"prompt_token_ids": prompt}, params, f"warm-up-{uuid.uuid4().hex}"):
            pass

    def openai_url(self) -> str | None:
        """The base URL of this engine's OpenAI API (`http://host:port/v1`), None when it serves none."""
        return None if self.server is None else self.server.url

    def openai_endpoint(self) -> tuple[str, str, str | None] | None:
        """`(base URL, served model name, api key)` of this engine's OpenAI API, None when it serves none."""
        if self.server is None:
            return None
        return self.server.url, self.server.served_model, self.rollout.api_key

    # -- sessions: agent runs over HTTP ------------------------------------------------------------------

    def open_session(
        self, max_turns: int, budget: int, call_timeout: float, seed: int | None, run_key: list
    ) -> str:
        """A new session's key, which the run's agent uses as its API key."""
        return self.sessions.open(SessionLimits(max_turns, budget, call_timeout, seed, tuple(run_key)))

    def collect_session(self, key: str) -> dict[str, Any]:
        """The session's calls in order and why its limits stopped it, if they did; the session ends."""
        return self.sessions.collect(key)

    def take_session_call(self, key: str, index: int) -> dict[str, Any]:
        """One finished call of an open session, handed over once (the serving front's store keeps it)."""
        return self.sessions.take_call(key, index)

    def close_session(self, key: str) -> None:
        """End a session uncollected (its run failed): its records go, its key stops working."""
        self.sessions.close(key)

    # -- admission: every request, direct or over HTTP ---------------------------------------------------

    async def admit(self) -> int:
        """Wait while a weight swap holds new requests back, count this one in flight, and return the model
        version at dispatch (the version its tokens are sampled with: a swap waits for requests in flight)."""
        await self.open.wait()
        if self.in_flight == 0:
            self.busy_since = time.monotonic()
        self.in_flight += 1
        return self.model_version

    async def release(self) -> None:
        async with self.drained:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.busy_s += time.monotonic() - self.busy_since
            self.drained.notify_all()

    async def abort_older_than(self, version: int) -> int:
        """Abort the direct requests in flight dispatched before `version`: after a sync they cannot commit
        within the staleness bound, so every token they would still sample is waste. Returns how many."""
        hopeless = [rid for rid, v in self.dispatched.items() if v < version and rid not in self.hopeless]
        if hopeless:
            self.hopeless.update(hopeless)
            await self.llm.abort(hopeless)
        return len(hopeless)

    def counters(self) -> dict[str, float]:
        """Running totals for the per-step metrics: seconds with a request in flight (direct or over HTTP),
        tokens sampled by requests aborted as hopeless, and requests cut by a swap to go on (partial
        rollout)."""
        busy = self.busy_s + (time.monotonic() - self.busy_since if self.in_flight else 0.0)
        return {
            "busy_s": busy,
            "wasted_tokens": float(self.wasted_tokens),
            "preempted": float(self.preemptions),
        }

    def check_request(self, body: dict[str, Any]) -> None:
        """The prompt rules for an OpenAI API request (`Prompts.check_request`), for the API's gate."""
        self.prompts.check_request(body)

    def decode(self, ids: list[int]) -> str:
        """Text of token ids, special tokens included (`Prompts.decode`), for workflows that show them."""
        return self.prompts.decode(ids)

    async def health(self) -> dict[str, Any]:
        """Raises when the vLLM core has died (the actor may live on); the supervisor then replaces it."""
        await self.llm.check_health()
        return {
            "model_version": self.model_version,
            "in_flight": self.in_flight,
            "adapter": self.current_adapter(),
        }

    def memory(self) -> dict[int, dict[str, int]]:
        """Resident and peak memory of this actor's process and its children (the vLLM core), by pid."""
        return process_tree_memory(os.getpid())

    def get_model_version(self) -> int:
        return self.model_version

    async def chat(self, messages: list[dict[str, str]], sampling: dict[str, Any]) -> dict[str, Any]:
        return await self.generate(self.prompts.render_chat(messages, self.prompts.limit(sampling)), sampling)

    async def chat_turn(
        self,
        messages: list[dict[str, Any]],
        sampling: dict[str, Any],
        history: list[int],
        budget: int | None = None,
    ) -> dict[str, Any]:
        """The next turn of a conversation whose ids so far are `history` (the last prompt and response).

        Only what the chat template adds after the last assistant message's content (the close of that
        turn, the new messages, the generation prompt) is tokenized and appended to `history`, so every id
        sampled earlier stays exactly as sampled, whatever its text re-tokenizes to. When the template does
        not render `messages` as the earlier turns, that content, then more (it re-renders the history),
        the prompt is `messages` rendered afresh, and the caller sees that it does not extend `history`.
        `max_tokens` is cut to the room left in `max_model_len` (and in `budget`, the most tokens the whole
        conversation may hold); with no room the result has no samples.
        """
        prompt = self.prompts.turn(messages, history)
        room = min(self.max_model_len, budget or self.max_model_len) - len(prompt)
        if room < 1:
            return Generation(prompt, "", self.model_version, []).as_dict()
        sampling = {**sampling, "max_tokens": min(int(sampling.get("max_tokens") or 16), room)}
        return await self.generate(prompt, sampling, limit=self.max_model_len - 1)

    async def generate(
        self, prompt: str | list[int], sampling: dict[str, Any], limit: int | None = None
    ) -> dict[str, Any]:
        """Sample `sampling['n']` responses; logprobs are those of the sampled tokens. `limit`: the longest
        prompt, in place of `prompt_limit` (a later turn's prompt holds the conversation so far). A sample
        cut by a swap with partial rollout goes on from the prompt plus what it had, under the new weights."""
        prompt_ids = self.prompts.prompt_ids(prompt, limit or self.prompts.limit(sampling))
        n = int(sampling.get("n") or 1)
        version, outputs, preempted = await self.request(prompt_ids, sampling, None, 0)
        drafts = [Draft() for _ in range(n)]
        for draft, choice in zip(drafts, outputs + [None] * (n - len(outputs)), strict=True):
            draft.add(choice, version)
        if preempted:
            await asyncio.gather(
                *(self.go_on(prompt_ids, d, sampling, i) for i, d in enumerate(drafts) if d.cut)
            )
        samples = [d.sample(self.sample_text(d)) for d in drafts]
        oldest = min((v for d in drafts for v in d.versions), default=version)
        return Generation(list(prompt_ids), self.tokenizer.decode(prompt_ids), oldest, samples).as_dict()

    def sample_text(self, draft: Draft) -> str | None:
        """A continued sample's text, decoded from all its ids at once (its pieces' texts may split a
        character between them); None for a sample made in one piece, whose text vLLM gave."""
        return self.tokenizer.decode(draft.ids, skip_special_tokens=True) if draft.pieces > 1 else None

    async def go_on(self, prompt_ids: list[int], draft: Draft, sampling: dict[str, Any], index: int) -> None:
        """Continue a sample cut by a swap until it finishes (it may be cut again by the next swap)."""
        preempted = True
        while preempted and draft.cut and (rest := draft.rest(sampling, index)) is not None:
            oldest = min(draft.versions, default=None)
            version, outputs, preempted = await self.request(
                [*prompt_ids, *draft.ids], rest, oldest, len(draft.ids)
            )
            draft.add(outputs[0] if outputs else None, version)

    async def request(
        self, prompt_ids: list[int], sampling: dict[str, Any], oldest: int | None, sampled: int
    ) -> tuple[int, list[Any], bool]:
        """One vLLM request: the version it ran on, its choices, and whether a swap cut it (partial rollout:
        the choices it cut end with finish reason `abort`, the others as they finished).

        `oldest`: the version of the first token sampled earlier for it (a continuation is judged stale by
        that token); `sampled`: how many were, counted as waste if it is aborted as hopeless.
        """
        from vllm import SamplingParams  # heavy, deferred: only the engine process imports vLLM
        from vllm.sampling_params import RequestOutputKind  # heavy, deferred: as above

        params = SamplingParams(**sampling, output_kind=RequestOutputKind.FINAL_ONLY)
        params.logprobs = sampling.get("logprobs") or 0
        version = await self.admit()
        request_id = uuid.uuid4().hex
        stamp = version if oldest is None else min(oldest, version)
        self.dispatched[request_id] = stamp
        try:
            final = None
            prompt = {"prompt_token_ids": list(prompt_ids)}
            async for output in self.llm.generate(prompt, params, request_id, lora_request=self.adapter):
                final = output
        except Exception as exc:
            if self.llm.errored:  # the core is gone: the request is not lost, it goes to the replacement
                raise EngineGone(f"vLLM engine core died: {exc}") from None
            raise
        finally:
            del self.dispatched[request_id]
            preempted = request_id in self.preempted
            self.preempted.discard(request_id)
            await self.release()
        outputs = list(final.outputs) if final is not None else []
        if request_id in self.hopeless:
            self.hopeless.discard(request_id)
            self.wasted_tokens += sampled + sum(len(c.token_ids) for c in outputs)
            raise StaleRequest(f"sampled on version {stamp}, which can no longer commit within max_staleness")
        return version, outputs, preempted

    async def shutdown(self) -> None:
        if self.server is not None:
            await self.server.stop()
        self.llm.shutdown()
