"""Recording a session's calls where the engine samples them, whatever route or client made them.

vLLM's OpenAI app turns every generating route (chat, completions, responses, messages) into calls of its
engine client's `generate`. The app is given `RecordingLLM` as that client: it passes everything through to
the `AsyncLLM`, and for a request the gate admitted under a session (`RECORDING`, a context variable the gate
sets, which the streaming response's task inherits), it
- asks for the sampled tokens' logprobs even when the caller asked for none, and strips them from what the
  app sees, so the caller gets what it asked for and the record what it needs;
- seeds the request from the run's seed when the caller set none, so a rerun samples the same;
- cuts `max_tokens` to the room left in the run's trajectory budget;
- records prompt ids, completion ids and logprobs as sampled (choice 0), streamed or not, and what was sampled
  when the client went away halfway (finish reason `abort`).

Every request the app makes under the run's one model name samples with the engine's current LoRA adapter,
when the run has one: the gate admitted it, so no swap runs until it finishes, and the adapter read here is
the one of the version stamped at admission. A request naming a loaded version (`lora-v3`, as `/v1/models`
lists them) samples with that one, and its record carries that version's number.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from operators.engine.adapters import lora_version
from operators.engine.samples import choice_tokens
from operators.engine.sessions import Session, SessionCall


@dataclass
class Recording:
    """Where the call the gate admitted is recorded, and its seed (None: the caller's own, or none)."""

    session: Session
    call: SessionCall
    seed: int | None
    index: int = 0  # the call's place in its session
    used: bool = False

    def next_call(self) -> SessionCall:
        """The record of the HTTP call's next engine request: the admitted one first, then a new one each."""
        if not self.used:
            self.used = True
            return self.call
        return self.session.add_call(self.call.route, self.call.model_version)


RECORDING: ContextVar[Recording | None] = ContextVar("rftflow_recording", default=None)


def prompt_length(prompt: Any) -> int | None:
    """The prompt's token count when the app hands `generate` token ids (its chat and completions do)."""
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else None
    return len(ids) if isinstance(ids, list) else None


def prepared(params: Any, recording: Recording, prompt: Any) -> tuple[Any, bool]:
    """A copy of the request's sampling params as the session needs them, and whether the caller asked for
    logprobs itself."""
    params = params.clone()
    wanted = params.logprobs is not None
    if not wanted:
        params.logprobs = 0  # the sampled token's own logprob only
    if params.seed is None and recording.seed is not None:
        params.seed = recording.seed
    length = prompt_length(prompt)
    if length is not None:
        room = recording.session.room(length)
        if room < 1:
            budget = recording.session.budget
            recording.session.stop("length", f"the trajectory holds max_trajectory_tokens={budget}")
            raise ValueError(f"the prompt fills this run's max_trajectory_tokens={budget}")
        params.max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
    return params, wanted


def take(call: SessionCall, output: Any, delta: bool) -> None:
    """Add one output of vLLM's to the call's record (choice 0)."""
    if output.prompt_token_ids:
        call.prompt_ids = list(output.prompt_token_ids)
    choice = next((c for c in output.outputs if c.index == 0), None)
    if choice is None:
        return
    ids, logprobs = choice_tokens(choice)
    if delta:
        call.response_ids += ids
        call.logprobs += logprobs
    else:
        call.response_ids, call.logprobs = ids, logprobs
    if choice.finish_reason is not None:
        call.finish_reason = str(choice.finish_reason)


class RecordingLLM:
    """The `AsyncLLM` as vLLM's OpenAI app sees it: every attribute is the engine's own, `generate` records
    the calls made under a session."""

    def __init__(self, llm: Any, adapter: Callable[[], Any] = lambda: None):
        """`adapter`: the engine's current LoRA adapter (a `LoRARequest`, None for the base model)."""
        self.llm = llm
        self.adapter = adapter

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)

    async def generate(self, prompt: Any, sampling_params: Any, *args: Any, **kwargs: Any) -> AsyncIterator:
        from vllm import SamplingParams  # heavy, deferred: engine process only
        from vllm.sampling_params import RequestOutputKind  # heavy, deferred: as above

        named = kwargs.get("lora_request")
        if named is None:
            kwargs["lora_request"] = self.adapter()
        recording = RECORDING.get()
        if recording is None or not isinstance(sampling_params, SamplingParams):
            async for output in self.llm.generate(prompt, sampling_params, *args, **kwargs):
                yield output
            return
        params, wanted = prepared(sampling_params, recording, prompt)
        delta = params.output_kind == RequestOutputKind.DELTA
        call = recording.next_call()
        if named is not None:
            call.model_version = lora_version(named.lora_int_id)
        try:
            async for output in self.llm.generate(prompt, params, *args, **kwargs):
                take(call, output, delta)
                if not wanted:
                    for choice in output.outputs:
                        choice.logprobs = None
                yield output
        finally:
            call.finish_reason = call.finish_reason or "abort"  # cut before it finished: what was sampled
