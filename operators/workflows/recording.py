"""An `openai.AsyncOpenAI` that records every call it makes, streamed ones included, as the engine sampled it.

Recording happens in the HTTP transport under the official client, so whatever the agent calls (chat or
completions, `with_raw_response`, `stream=True`) is seen the same way. Each generating request is sent with
`return_token_ids` and the sampled tokens' logprobs (vLLM's server returns them), and with a seed derived from
the run when the agent set none, so a rerun samples the same. Each answer becomes a `Call`: vLLM's prompt
token ids, completion token ids and logprobs, and the model version the engine stamped at dispatch.

Limits: once the run has made `max_turns` calls, or its last call filled `budget` tokens, a further call
is refused before it is sent (`TurnLimit`), and the run ends there.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from operators.engine.client import derive_seed
from operators.engine.openai_server import GENERATING, VERSION_HEADER
from operators.workflows.trajectory import Call


class TurnLimit(RuntimeError):
    """The run may make no more calls: `max_turns` calls made, or the token budget filled."""

    def __init__(self, message: str, finish_reason: str):
        super().__init__(message)
        self.finish_reason = finish_reason


@dataclass
class Recorder:
    """The calls of one run, in the order they were sent."""

    seed: int | None
    max_turns: int
    budget: int
    calls: list[Call | None] = field(default_factory=list)
    stopped: TurnLimit | None = None

    def admit(self) -> int:
        """A slot for the next call, or TurnLimit."""
        done = [c for c in self.calls if c is not None]
        if len(self.calls) >= self.max_turns:
            self.stopped = TurnLimit(f"max_turns={self.max_turns} calls made", "max_turns")
        elif done and len(done[-1].prompt_ids) + len(done[-1].response_ids) >= self.budget:
            self.stopped = TurnLimit(f"the trajectory holds max_trajectory_tokens={self.budget}", "length")
        if self.stopped is not None:
            raise self.stopped
        self.calls.append(None)
        return len(self.calls) - 1

    def recorded(self) -> list[Call]:
        return [c for c in self.calls if c is not None]


def prepared(body: dict[str, Any], chat: bool, seed: int | None) -> dict[str, Any]:
    """The request as sent: token ids and sampled logprobs asked for, and a seed unless the agent set one."""
    body = {**body, "return_token_ids": True}
    if chat:
        body["logprobs"] = True
    elif not isinstance(body.get("logprobs"), int) or isinstance(body.get("logprobs"), bool):
        body["logprobs"] = 0  # the sampled token's logprob only
    if body.get("seed") is None and seed is not None:
        body["seed"] = seed
    return body


def choice_logprobs(choice: dict[str, Any], chat: bool) -> list[float]:
    logprobs = choice.get("logprobs") or {}
    if chat:
        return [float(entry["logprob"]) for entry in logprobs.get("content") or []]
    return [float(v) for v in logprobs.get("token_logprobs") or []]


def call_of(parts: list[dict[str, Any]], chat: bool, version: int) -> Call:
    """A Call from a response body, or the chunks of a streamed one (choice 0: a trajectory is one path)."""
    prompt_ids: list[int] = []
    response_ids: list[int] = []
    logprobs: list[float] = []
    finish = ""
    for part in parts:
        prompt_ids = part.get("prompt_token_ids") or prompt_ids
        for choice in part.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            prompt_ids = choice.get("prompt_token_ids") or prompt_ids
            response_ids += choice.get("token_ids") or []
            logprobs += choice_logprobs(choice, chat)
            finish = choice.get("finish_reason") or finish
    if not prompt_ids or len(logprobs) != len(response_ids):
        raise ValueError(
            f"the engine's answer holds {len(prompt_ids)} prompt ids, {len(response_ids)} response ids and "
            f"{len(logprobs)} logprobs: not a call that can be recorded"
        )
    return Call(prompt_ids, response_ids, logprobs, version, finish)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """The JSON events of a server-sent event stream (`data: {...}` lines; `[DONE]` ends it)."""
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            if data and data != "[DONE]":
                events.append(json.loads(data))
    return events


class TeeStream(httpx.AsyncByteStream):
    """A streamed response passed on as it comes, and recorded once it has all come."""

    def __init__(self, inner: httpx.AsyncByteStream, on_complete: Any):
        self.inner, self.on_complete = inner, on_complete
        self.chunks: list[bytes] = []

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.chunks.append(chunk)
            yield chunk
        self.on_complete(b"".join(self.chunks))

    async def aclose(self) -> None:
        await self.inner.aclose()


class RecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self, recorder: Recorder, run_key: tuple[Any, ...]):
        self.inner = httpx.AsyncHTTPTransport()
        self.recorder = recorder
        self.run_key = run_key

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = next((p for p in GENERATING if request.url.path.endswith(p)), None)
        if request.method != "POST" or path is None:
            return await self.inner.handle_async_request(request)
        chat = path.endswith("chat/completions")
        slot = self.recorder.admit()
        seed = derive_seed(self.recorder.seed, *self.run_key, slot)
        body = json.dumps(prepared(json.loads(request.content), chat, seed)).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        sent = httpx.Request(request.method, request.url, headers=headers, content=body)
        response = await self.inner.handle_async_request(sent)
        if response.status_code >= 400:
            self.recorder.calls[slot] = None
            return response
        version = int(response.headers.get(VERSION_HEADER, "0"))

        def record(raw: bytes) -> None:
            streamed = "text/event-stream" in response.headers.get("content-type", "")
            parts = sse_events(raw) if streamed else [json.loads(raw)]
            self.recorder.calls[slot] = call_of(parts, chat, version)

        if "text/event-stream" in response.headers.get("content-type", ""):
            response.stream = TeeStream(response.stream, record)
            return response
        raw = await response.aread()
        record(raw)
        kept = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "content-encoding")
        }
        return httpx.Response(response.status_code, headers=kept, content=raw, request=sent)

    async def aclose(self) -> None:
        await self.inner.aclose()


def recording_client(
    url: str, api_key: str | None, recorder: Recorder, run_key: tuple[Any, ...], timeout: float
) -> Any:
    """An `openai.AsyncOpenAI` on one engine's endpoint whose calls `recorder` keeps. It never retries: a
    retried call would be a second call in the trajectory."""
    import openai  # heavy, deferred: only agent workflows use the official client

    http = httpx.AsyncClient(transport=RecordingTransport(recorder, run_key), timeout=timeout)
    return openai.AsyncOpenAI(
        base_url=url, api_key=api_key or "EMPTY", http_client=http, max_retries=0, timeout=timeout
    )
