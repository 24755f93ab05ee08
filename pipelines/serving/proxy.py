"""One model call through the serving front: sent to its engine, answered to the caller, and stored.

The engine records the call as it sampled it (under the engine session the front holds for the caller's
session) and names its place in a header; the front takes that record and commits it to the store **before**
the last of the answer goes out: for a plain answer, before any of it; for a stream, before its final event
(`data: [DONE]`, `response.completed`, `message_stop`). An answer the caller has fully received is
therefore durable, whatever process is killed next. A call's id, for rewards, is the response's `id`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
from starlette.responses import Response, StreamingResponse

from operators.engine.http_gate import CALL_HEADER

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"}
)
FINAL_EVENTS = ("response.completed", "message_stop", "response.failed", "response.incomplete")


@dataclass
class Upstream:
    """Where the call goes: the engine's URL and the engine session's key."""

    url: str
    key: str


Store = Callable[[str, int], Awaitable[None]]  # (the response's id, the call's index) -> durable


def passed_headers(response: httpx.Response) -> dict[str, str]:
    return {
        k: v for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != CALL_HEADER
    }


def is_final(event: bytes) -> bool:
    """Whether an SSE event ends its stream."""
    text = event.decode(errors="replace")
    return "data: [DONE]" in text or any(
        f"event: {name}" in text or f'"type": "{name}"' in text or f'"type":"{name}"' in text
        for name in FINAL_EVENTS
    )


def event_id(event: bytes) -> str | None:
    """The response id an SSE event carries (chat and completions chunks, Responses and Messages events)."""
    for line in event.decode(errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        try:
            data = json.loads(line[5:].strip())
        except ValueError:
            continue
        if isinstance(data, dict):
            for holder in (data, data.get("response"), data.get("message")):
                if isinstance(holder, dict) and isinstance(holder.get("id"), str):
                    return holder["id"]
    return None


class Timing:
    """The front's own time per call: its response time less the engine's, for the added-latency figure."""

    def __init__(self) -> None:
        self.added_ms: list[float] = []

    def add(self, front_s: float, engine_s: float) -> None:
        self.added_ms.append(max(0.0, (front_s - engine_s) * 1000))
        del self.added_ms[:-10_000]

    def quantile(self, q: float) -> float:
        if not self.added_ms:
            return 0.0
        ordered = sorted(self.added_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def forward(
    http: httpx.AsyncClient,
    upstream: Upstream,
    path: str,
    body: bytes,
    streamed: bool,
    store: Store,
    timing: Timing,
    started: float,
    on_done: Callable[[], None],
) -> Response:
    """Send the call to its engine and answer with what the engine answers, stored first."""
    headers = {"Authorization": f"Bearer {upstream.key}", "Content-Type": "application/json"}
    request = http.build_request("POST", f"{upstream.url}{path}", content=body, headers=headers)
    sent = time.perf_counter()
    try:
        response = await http.send(request, stream=True)
    except BaseException:
        on_done()
        raise
    index = response.headers.get(CALL_HEADER)
    if (
        not streamed
        or response.status_code >= 400
        or "text/event-stream" not in response.headers.get("content-type", "")
    ):
        try:
            raw = await response.aread()
        finally:
            await response.aclose()
        engine_s = time.perf_counter() - sent
        try:
            if index is not None and response.status_code < 400:
                await store(json.loads(raw)["id"], int(index))
        finally:
            on_done()
        timing.add(time.perf_counter() - started, engine_s)
        return Response(
            raw, response.status_code, passed_headers(response), response.headers.get("content-type")
        )
    return StreamingResponse(
        relay(response, index, store, timing, started, sent, on_done),
        response.status_code,
        passed_headers(response),
        media_type="text/event-stream",
    )


async def relay(
    response: httpx.Response,
    index: str | None,
    store: Store,
    timing: Timing,
    started: float,
    sent: float,
    on_done: Callable[[], None],
) -> AsyncIterator[bytes]:
    """A stream passed on event by event, its final event held until the call is durable."""
    buffer, call_id, stored = b"", None, False
    try:
        async for chunk in response.aiter_raw():
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                event += b"\n\n"
                call_id = call_id or event_id(event)
                if is_final(event) and not stored and index is not None and call_id is not None:
                    engine_s = time.perf_counter() - sent
                    await store(call_id, int(index))
                    stored = True
                    timing.add(time.perf_counter() - started, engine_s)
                yield event
        if not stored and index is not None and call_id is not None:  # the engine ended it without one
            await store(call_id, int(index))
        if buffer:
            yield buffer
    finally:
        await response.aclose()
        on_done()
