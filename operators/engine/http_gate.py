"""`EngineGate`: the ASGI app around vLLM's OpenAI app on each engine, which it cannot be bypassed around.

vLLM's `add_middleware` cannot be used once its app is built, so the whole app sits inside this gate. By the
route tables of `operators.engine.routes`:
- an admitted (generating) request needs a session's key (`operators.engine.sessions`) or the engine's
  `api_key`; it is held to the session's limits and the prompt rules (a 4xx naming them), waits while weights
  are swapped, counts as in flight, is recorded under its session (`operators.engine.recording_llm`), and its
  response carries the model version at dispatch in the `x-rftflow-model-version` header. A call that runs
  past the session's `call_timeout` is cut (its vLLM request freed) and answered 408;
- a refused route is answered 403 with the reason; so is a route of the app in no table (a newer vLLM's);
- every other route goes straight through, under the `api_key` when one is set (`/v1/models`, ...).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from operators.engine.recording_llm import RECORDING, Recording
from operators.engine.request_bodies import unrecordable
from operators.engine.routes import ADMITTED, PASSED, REFUSED, matched_route
from operators.engine.sessions import Session, SessionBook, SessionRefused
from schemas.errors import TaskInputError

log = logging.getLogger(__name__)

VERSION_HEADER = "x-rftflow-model-version"
CALL_HEADER = "x-rftflow-call"  # a session call's index in its session: where its record is (`take_call`)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    408: "RequestTimeout",
    413: "RequestTooLarge",
}


class Admission(Protocol):
    """What the gate needs from the engine: its pause, its version, its prompt rules and its sessions."""

    sessions: SessionBook

    async def admit(self) -> int:
        """Wait while weights are swapped, count the request in flight; the model version at dispatch."""
        ...

    async def release(self) -> None: ...

    def check_request(self, body: dict[str, Any]) -> None:
        """Raise TaskInputError for a request the engine's prompt rules refuse."""
        ...


async def send_error(send: Send, status: int, message: str) -> None:
    """An error as vLLM's server writes one (the OpenAI client raises it as BadRequestError and the like)."""
    kind = ERROR_TYPES.get(status, "Error")
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def bearer(scope: Scope) -> str | None:
    """The request's API key: `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`."""
    headers = dict(scope.get("headers") or [])
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth.lower().startswith("bearer "):
        return auth[len("bearer ") :].strip() or None
    key = headers.get(b"x-api-key", b"").decode("latin-1").strip()
    return key or None


class EngineGate:
    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        admission: Admission,
        api_key: str | None = None,
        max_body_bytes: int = 64 * 2**20,
    ):
        self.app = app
        self.admission = admission
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = matched_route(self.app, scope)
        if route is None:  # no route: vLLM's 404
            await self.app(scope, receive, send)
        elif route in ADMITTED:
            await self.admitted(route, scope, receive, send)
        elif route in PASSED:
            await self.passed(scope, receive, send)
        else:
            why = REFUSED.get(route, "this route is in none of rftflow's route tables (a newer vLLM's?)")
            await send_error(send, 403, f"{route} is not served on an rftflow engine: {why}")

    async def passed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A route that generates nothing; under `/v1` it needs the engine's key or a session's, when the
        engine has a key (as vLLM's own `--api-key` would)."""
        if self.api_key is not None and scope["path"].startswith("/v1"):
            key = bearer(scope)
            if key != self.api_key and key not in self.admission.sessions.sessions:
                await send_error(send, 401, "give the engine's api_key or a session's key")
                return
        await self.app(scope, receive, send)

    async def admitted(self, route: str, scope: Scope, receive: Receive, send: Send) -> None:
        key = bearer(scope)
        try:
            session = (
                None if self.api_key is not None and key == self.api_key else self.admission.sessions.get(key)
            )
        except SessionRefused as exc:
            await send_error(send, exc.status, str(exc))
            return
        body = await self.read_body(receive, send)
        if body is None:
            return
        try:
            parsed = json.loads(body) if body else {}
            if isinstance(parsed, dict):
                self.admission.check_request(parsed)
                if (why := unrecordable(parsed)) is not None:
                    raise TaskInputError(why)
        except TaskInputError as exc:
            await send_error(send, 400, str(exc))
            return
        except ValueError:
            pass  # not JSON: vLLM answers it with its own 400
        try:
            recording = None if session is None else self.start_call(session, route)
        except SessionRefused as exc:
            await send_error(send, exc.status, str(exc))
            return
        await self.serve(scope, body, receive, send, recording)

    async def read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole request body, or None when the client left or it passed the limit (answered 413)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await send_error(send, 413, f"request body over max_request_bytes={self.max_body_bytes}")
                return None
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    def start_call(session: Session, route: str) -> Recording:
        call, seed = session.admit(route)
        return Recording(session, call, seed, index=len(session.calls) - 1)

    async def serve(
        self, scope: Scope, body: bytes, receive: Receive, send: Send, recording: Recording | None
    ) -> None:
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when the client goes

        version = await self.admission.admit()
        started = False

        async def stamped(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [*message.get("headers", []), (VERSION_HEADER.encode(), str(version).encode())]
                if recording is not None:
                    headers.append((CALL_HEADER.encode(), str(recording.index).encode()))
                message = {**message, "headers": headers}
            await send(message)

        timeout = None if recording is None else recording.session.limits.call_timeout
        token = None
        if recording is not None:
            recording.call.model_version = version
            token = RECORDING.set(recording)
        try:
            async with asyncio.timeout(timeout):
                await self.app(scope, replay, stamped)
        except TimeoutError:
            await self.timed_out(send, started, timeout)
        finally:
            if token is not None:
                RECORDING.reset(token)
            await self.admission.release()

    @staticmethod
    async def timed_out(send: Send, started: bool, timeout: float | None) -> None:
        """A call past the session's call_timeout, cut: its vLLM request was freed with the cancellation."""
        message = f"the call ran past this run's call_timeout={timeout:g}s and was stopped"
        log.warning(message)
        if not started:
            await send_error(send, 408, message)
        else:  # a stream already under way ends here
            await send({"type": "http.response.body", "body": b"", "more_body": False})
