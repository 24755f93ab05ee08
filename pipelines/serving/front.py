"""The serving front: one OpenAI-compatible endpoint before the engines, with sessions, rewards and commits.

Routes (docs/serving.md):
- model calls: `/v1/chat/completions`, `/v1/responses`, `/v1/completions`, `/v1/messages` (streaming too),
  with a session's key, or with none (Trinity's client sends `api_key="EMPTY"`): a sessionless call;
- `POST /sessions` -> `{session_id, api_key}`; `POST /sessions/{id}/reward {reward, call_id?}`;
  `POST /sessions/{id}/end`;
- Trinity's shape: `POST /feedback {msg_ids, reward, task_id}`, `POST /commit`, `GET /metrics` (JSON;
  Prometheus text at `/metrics/prometheus` or with `Accept: text/plain`), `GET /health`; and `GET /v1/models`.

Limits: `serve.max_concurrent` calls at once (then 429), `serve.max_request_bytes` a body (413), and a
session idle for `serve.idle_session_s` ends by itself. With `serve.admin_key`, everything but a session's own
calls needs that key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from pipelines.serving.commits import Committer
from pipelines.serving.engines import EnginePool, ServedEngine
from pipelines.serving.proxy import Timing, Upstream, forward
from pipelines.serving.store import RewardError, ServeStore
from schemas.serve_config import ServeConfig

log = logging.getLogger(__name__)
KEY_PREFIX = "rfs-"
SESSIONLESS = "sessionless"
MODEL_ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/messages")


@dataclass
class FrontSession:
    id: str
    key: str
    engine: ServedEngine | None = None
    engine_key: str | None = None
    last_used: float = field(default_factory=time.monotonic)


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status)


def bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return (
        auth[7:].strip() or None if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
    )


class Front:
    def __init__(
        self,
        settings: ServeConfig,
        pool: EnginePool,
        store: ServeStore,
        committer: Committer,
        executor: Executor,
    ):
        self.settings, self.pool, self.store, self.committer = settings, pool, store, committer
        self.executor = executor
        self.sessions: dict[str, FrontSession] = {}  # by key
        self.by_id: dict[str, FrontSession] = {}
        self.active = 0
        self.timing = Timing()
        self.commit_lock = asyncio.Lock()
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(settings.call_timeout + 5, connect=10))
        self.steps = store.last_step()
        self.sync_failures = 0  # rolling updates that failed (and were rolled back)
        if store.session_state(SESSIONLESS) is None:
            store.open_session(SESSIONLESS, None, kind=SESSIONLESS)
        routes = [Route(p, self.model_call, methods=["POST"]) for p in MODEL_ROUTES]
        routes += [
            Route("/sessions", self.open_session, methods=["POST"]),
            Route("/sessions/{session_id}/reward", self.reward, methods=["POST"]),
            Route("/sessions/{session_id}/end", self.end, methods=["POST"]),
            Route("/feedback", self.feedback, methods=["POST"]),
            Route("/commit", self.commit, methods=["POST"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/metrics/prometheus", self.prometheus, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ]
        self.app = Starlette(routes=routes)

    async def io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in the front's own threads: the store's calls wait there for their disk sync."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def close(self) -> None:
        await self.http.aclose()

    # -- keys -----------------------------------------------------------------------------------------------

    def admitted(self, request: Request) -> bool:
        """Whether an admin route (or a sessionless call) may go on: always, unless an admin key is set."""
        return self.settings.admin_key is None or bearer(request) == self.settings.admin_key

    async def body(self, request: Request) -> bytes | None:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.settings.max_request_bytes:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    # -- sessions -------------------------------------------------------------------------------------------

    async def open_session(self, request: Request) -> Response:
        if not self.admitted(request):
            return error(401, "opening a session needs serve.admin_key")
        session = FrontSession(secrets.token_hex(12), KEY_PREFIX + secrets.token_urlsafe(24))
        await self.io(self.store.open_session, session.id, session.key)
        self.sessions[session.key], self.by_id[session.id] = session, session
        return JSONResponse({"session_id": session.id, "api_key": session.key})

    async def end(self, request: Request) -> Response:
        session = self.by_id.get(request.path_params["session_id"])
        if session is None:
            return error(404, f"no open session {request.path_params['session_id']!r}")
        await self.finish(session, "ended")
        return JSONResponse({"session_id": session.id, "state": "ended"})

    async def finish(self, session: FrontSession, state: str) -> None:
        """End a session: its key stops working, its engine session is let go."""
        self.sessions.pop(session.key, None)
        self.by_id.pop(session.id, None)
        await self.io(self.store.end_session, session.id, state)
        if session.engine is not None and session.engine_key is not None:
            await self.pool.close_session(session.engine, session.engine_key)

    def unpin(self, indices: list[int]) -> None:
        """Sessions pinned to a replaced engine go to the least loaded one at their next call (their engine
        session died with the old engine; what it had recorded is stored already)."""
        for session in self.sessions.values():
            if session.engine is not None and session.engine.index in indices:
                session.engine, session.engine_key = None, None

    async def sweep(self) -> None:
        """End the sessions idle past serve.idle_session_s."""
        now = time.monotonic()
        for session in [
            s for s in self.sessions.values() if now - s.last_used > self.settings.idle_session_s
        ]:
            log.info("session %s idle for %.0f s: ended", session.id, now - session.last_used)
            await self.finish(session, "expired")

    async def reward(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        try:
            body = json.loads(await request.body() or b"{}")
            value = float(body["reward"])
        except (ValueError, KeyError, TypeError):
            return error(400, 'give {"reward": <number>, "call_id": <optional response id>}')
        if await self.io(self.store.session_state, session_id) is None:
            return error(404, f"no session {session_id!r}")
        call_id = body.get("call_id") or await self.io(self.store.last_call, session_id)
        if call_id is None:
            return error(404, f"session {session_id!r} has made no call to reward")
        try:
            applied = await self.io(self.store.reward, [call_id], value, session_id)
        except RewardError as exc:
            return error(exc.status, str(exc))
        return JSONResponse({"call_id": call_id, "applied": bool(applied)})

    # -- model calls ----------------------------------------------------------------------------------------

    async def model_call(self, request: Request) -> Response:
        if self.active >= self.settings.max_concurrent:
            return error(429, f"serve.max_concurrent={self.settings.max_concurrent} calls in progress")
        key = bearer(request)
        session = self.sessions.get(key or "")
        if session is None and key is not None and key.startswith(KEY_PREFIX):
            return error(401, "no open session has this key: it ended, or it is not this front's")
        if session is None and not self.admitted(request):
            return error(401, "a sessionless call needs serve.admin_key")
        body = await self.body(request)
        if body is None:
            return error(413, f"request body over serve.max_request_bytes={self.settings.max_request_bytes}")
        try:
            streamed = bool(json.loads(body).get("stream"))
        except (ValueError, AttributeError):
            return error(400, "the request body is not a JSON object")
        started = time.perf_counter()
        engine, engine_key, session_id = await self.route(session)
        self.active += 1
        engine.in_flight += 1
        engine.requests += 1

        def done() -> None:
            self.active -= 1
            engine.in_flight -= 1

        async def store(call_id: str, index: int) -> None:
            record = await self.pool.take(engine, engine_key, index)
            await self.io(self.store.record_call, call_id, session_id, record)

        upstream = Upstream(engine.url.removesuffix("/v1"), engine_key)
        return await forward(
            self.http, upstream, request.url.path, body, streamed, store, self.timing, started, done
        )

    async def route(self, session: FrontSession | None) -> tuple[ServedEngine, str, str]:
        """The engine, engine session key and front session id of a call."""
        if session is None:
            engine = self.pool.pick()
            return engine, engine.sessionless_key, SESSIONLESS
        session.last_used = time.monotonic()
        if session.engine is None:  # its first call: the least loaded engine, then sticky
            session.engine = self.pool.pick()
            session.engine_key = await self.pool.open_session(session.engine, session.id)
        return session.engine, session.engine_key, session.id

    # -- Trinity's shape, and the rest ----------------------------------------------------------------------

    async def feedback(self, request: Request) -> Response:
        if not self.admitted(request):
            return error(401, "feedback needs serve.admin_key")
        try:
            body = json.loads(await request.body() or b"{}")
            ids, value = body["msg_ids"], float(body["reward"])
            assert isinstance(ids, list) and all(isinstance(i, str) for i in ids)
        except (ValueError, KeyError, TypeError, AssertionError):
            return error(400, "msg_ids (a list of response ids) and reward (a number) are required")
        try:
            applied = await self.io(self.store.reward, ids, value, None, body.get("task_id"))
        except RewardError as exc:
            return error(exc.status, str(exc))
        return JSONResponse({"status": "success", "applied": len(applied)})

    async def commit(self, request: Request) -> Response:
        if not self.admitted(request):
            return error(401, "committing needs serve.admin_key")
        return JSONResponse({"status": "success", **await self.commit_now()})

    async def commit_now(self) -> dict[str, Any]:
        async with self.commit_lock:
            result = await self.io(self.committer.commit)
        if result["step"] is not None:
            self.steps = result["step"]
        return result

    def figures(self) -> dict[str, float]:
        counts = self.store.counts()
        figures: dict[str, float] = {}
        for e in self.pool.engines:
            figures[f"rollout/model_{e.index}/total_request_count"] = e.requests
            figures[f"rollout/model_{e.index}/model_version"] = e.version
        figures["rollout/total_experience_count"] = counts["calls"]
        figures["rollout/ready_experience_count"] = counts["rewarded"] - counts["committed"]
        figures["explore_step_num"] = self.steps
        figures["serve/sessions_open"] = len(self.sessions)
        figures["serve/in_flight"] = self.active
        figures["serve/unrewarded"] = counts["unrewarded"]
        figures["serve/sync_failed"] = self.sync_failures
        figures["serve/added_latency_ms/p50"] = self.timing.quantile(0.5)
        figures["serve/added_latency_ms/p99"] = self.timing.quantile(0.99)
        return figures

    async def metrics(self, request: Request) -> Response:
        if not self.admitted(request):
            return error(401, "metrics need serve.admin_key")
        if "text/plain" in request.headers.get("accept", ""):
            return await self.prometheus(request)
        return JSONResponse(await self.io(self.figures))

    async def prometheus(self, request: Request) -> Response:
        if not self.admitted(request):
            return error(401, "metrics need serve.admin_key")
        lines = []
        for name, value in (await self.io(self.figures)).items():
            metric = "rftflow_" + name.replace("/", "_").replace(".", "_")
            lines += [f"# TYPE {metric} gauge", f"{metric} {value}"]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "engines": len(self.pool.engines)})

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.pool.model, "object": "model"}]})
