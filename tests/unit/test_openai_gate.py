"""`EngineGate`, the ASGI wrapper that puts HTTP requests under the engine's route tables, sessions, pause,
version stamp and prompt rules, without vLLM. The app inside is a real Starlette app whose routes echo (vLLM's
paths), and the session book is the real one; the engine's admission is a test double (named so): the gate's
own behaviour is what is checked. tests/engine/test_sessions.py runs it around vLLM's real app."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from operators.engine.http_gate import VERSION_HEADER, EngineGate
from operators.engine.request_bodies import request_text, requested_max_tokens
from operators.engine.routes import ADMITTED, PASSED, REFUSED, unclassified
from operators.engine.sessions import SessionBook, SessionLimits
from schemas.errors import TaskInputError

PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/chat/completions/batch",
    "/v1/models",
    "/health",
    "/v1/responses/{response_id}",
    "/v1/brand_new_generate",
]


class EchoApp:
    """A Starlette app with vLLM's paths, each answering 200 with the body it was given; `delay_s` makes
    every answer slow."""

    def __init__(self) -> None:
        self.calls = 0
        self.delay_s = 0.0
        routes = [Route(p, self.echo, methods=["GET", "POST"]) for p in PATHS]
        self.app = Starlette(routes=routes)
        self.routes = self.app.routes

    async def echo(self, request: Request) -> JSONResponse:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        body = await request.body()
        return JSONResponse({"path": request.url.path, "got": json.loads(body or b"{}")})

    async def __call__(self, scope, receive, send) -> None:
        await self.app(scope, receive, send)


class AdmissionDouble:
    """Stands in for the engine actor's admission: a pause, a version, a 10-character prompt limit, and a
    real session book."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.version, self.in_flight, self.peak = 3, 0, 0
        self.sessions = SessionBook()

    async def admit(self) -> int:
        await self.open.wait()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return self.version

    async def release(self) -> None:
        self.in_flight -= 1

    def check_request(self, body: dict) -> None:
        if len(request_text(body)) > 10:
            raise TaskInputError("prompt has at least 11 tokens, more than max_model_len - max_tokens=10")


def limits(max_turns: int = 8, call_timeout: float = 30.0) -> SessionLimits:
    return SessionLimits(
        max_turns=max_turns, budget=1000, call_timeout=call_timeout, seed=0, run_key=("t", 0)
    )


def client(app, admission, key: str | None = None, api_key: str | None = None, max_body: int = 4096):
    gate = EngineGate(app, admission, api_key=api_key, max_body_bytes=max_body)
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gate), base_url="http://engine", headers=headers
    )


CHAT = {"model": "m", "messages": [{"role": "user", "content": "1+1="}]}


def post(app, admission, path: str, body: dict, **kw) -> httpx.Response:
    async def go() -> httpx.Response:
        async with client(app, admission, **kw) as http:
            return await http.post(path, json=body)

    return asyncio.run(asyncio.wait_for(go(), 20))


def test_a_session_call_carries_the_version_at_dispatch_is_counted_and_released():
    app, admission = EchoApp(), AdmissionDouble()
    key = admission.sessions.open(limits())
    response = post(app, admission, "/v1/responses", {"model": "m", "input": "1+1="}, key=key)
    assert response.status_code == 200 and response.headers[VERSION_HEADER] == "3"
    assert response.json()["got"] == {"model": "m", "input": "1+1="}  # the body reaches the app whole
    assert admission.peak == 1 and admission.in_flight == 0
    [call] = admission.sessions.sessions[key].calls
    assert call.route == "/v1/responses" and call.model_version == 3


@pytest.mark.parametrize("key", [None, "rft-unknown"])
def test_a_generating_call_without_an_open_sessions_key_is_401(key):
    app, admission = EchoApp(), AdmissionDouble()
    response = post(app, admission, "/v1/chat/completions", CHAT, key=key)
    assert response.status_code == 401 and app.calls == 0
    assert "no open session" in response.json()["error"]["message"]


def test_a_collected_sessions_key_stops_working():
    app, admission = EchoApp(), AdmissionDouble()
    key = admission.sessions.open(limits())
    assert post(app, admission, "/v1/messages", CHAT, key=key).status_code == 200
    assert admission.sessions.collect(key)["calls"] == []  # nothing sampled by the echo app: nothing kept
    assert post(app, admission, "/v1/messages", CHAT, key=key).status_code == 401


def test_the_engines_own_key_calls_outside_any_session_and_guards_v1_routes():
    app, admission = EchoApp(), AdmissionDouble()
    assert post(app, admission, "/v1/chat/completions", CHAT, key="admin", api_key="admin").status_code == 200

    async def models(key: str | None) -> int:
        async with client(app, admission, key=key, api_key="admin") as http:
            return (await http.get("/v1/models")).status_code

    assert asyncio.run(models(None)) == 401 and asyncio.run(models("admin")) == 200


@pytest.mark.parametrize(
    "path, why",
    [
        ("/v1/chat/completions/batch", REFUSED["/v1/chat/completions/batch"]),
        ("/v1/responses/abc", REFUSED["/v1/responses/{response_id}"]),
        ("/v1/brand_new_generate", "in none of rftflow's route tables"),
    ],
)
def test_refused_and_unclassified_routes_answer_403_naming_the_route_and_why(path, why):
    app, admission = EchoApp(), AdmissionDouble()
    response = post(app, admission, path, CHAT, key=admission.sessions.open(limits()))
    message = response.json()["error"]["message"]
    assert response.status_code == 403 and app.calls == 0 and why in message and path.split("/")[2] in message


def test_a_call_past_max_turns_is_refused_naming_the_limit_and_the_session_remembers_it():
    app, admission = EchoApp(), AdmissionDouble()
    key = admission.sessions.open(limits(max_turns=2))
    assert [post(app, admission, "/v1/completions", {"prompt": "x"}, key=key).status_code for _ in "ab"] == [
        200,
        200,
    ]
    refused = post(app, admission, "/v1/completions", {"prompt": "x"}, key=key)
    assert refused.status_code == 400 and "max_turns=2" in refused.json()["error"]["message"]
    assert app.calls == 2 and admission.sessions.collect(key)["stopped"] == "max_turns"


def test_a_call_past_call_timeout_is_cut_with_408():
    app, admission = EchoApp(), AdmissionDouble()
    app.delay_s = 5.0
    key = admission.sessions.open(limits(call_timeout=0.2))
    response = post(app, admission, "/v1/chat/completions", CHAT, key=key)
    assert response.status_code == 408 and "call_timeout=0.2s" in response.json()["error"]["message"]
    assert admission.in_flight == 0


def test_an_oversized_body_is_413_unread_and_unrecordable_features_are_400():
    app, admission = EchoApp(), AdmissionDouble()
    key = admission.sessions.open(limits())
    big = {"model": "m", "input": "x" * 10_000}
    assert post(app, admission, "/v1/responses", big, key=key).status_code == 413
    for extra, word in [({"background": True}, "background"), ({"previous_response_id": "r1"}, "r1")]:
        response = post(app, admission, "/v1/responses", {"model": "m", "input": "hi", **extra}, key=key)
        assert response.status_code == 400 and word in response.json()["error"]["message"]
    assert app.calls == 0 and admission.sessions.sessions[key].calls == []


def test_a_request_waits_while_weights_are_swapped():
    app, admission = EchoApp(), AdmissionDouble()
    admission.open.clear()  # a swap in progress
    key = admission.sessions.open(limits())

    async def go() -> tuple[int, httpx.Response]:
        async with client(app, admission, key=key) as http:
            pending = asyncio.create_task(http.post("/v1/completions", json={"prompt": "2+2="}))
            await asyncio.sleep(0.2)
            held = app.calls
            admission.version = 4  # the swap's new version, stamped before requests resume
            admission.open.set()
            return held, await pending

    held, response = asyncio.run(go())
    assert held == 0 and app.calls == 1
    assert response.headers[VERSION_HEADER] == "4"
    assert admission.sessions.sessions[key].calls[0].model_version == 4


def test_a_prompt_over_the_rules_is_answered_400_without_reaching_vllm():
    app, admission = EchoApp(), AdmissionDouble()
    long = {"model": "m", "messages": [{"role": "user", "content": "1+1=" * 10}]}
    response = post(app, admission, "/v1/chat/completions", long, key=admission.sessions.open(limits()))
    assert response.status_code == 400 and app.calls == 0
    assert "max_model_len - max_tokens=10" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/models", "/health"])
def test_other_paths_pass_straight_through(path):
    app, admission = EchoApp(), AdmissionDouble()
    admission.open.clear()  # would hold a generating request

    async def go() -> httpx.Response:
        async with client(app, admission) as http:
            return await http.get(path)

    response = asyncio.run(asyncio.wait_for(go(), 10))
    assert response.status_code == 200 and VERSION_HEADER not in response.headers


def test_request_text_gathers_every_prompt_part_of_every_api():
    body = {"messages": [{"content": "a"}, {"content": [{"type": "text", "text": "b"}, {"type": "image"}]}]}
    assert request_text(body) == "ab"
    assert request_text({"prompt": ["c", "d"]}) == "cd"
    responses = {
        "instructions": "i",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "j"}]}],
    }
    assert request_text(responses) == "ij"
    anthropic = {"system": [{"type": "text", "text": "s"}], "messages": [{"role": "user", "content": "m"}]}
    assert request_text(anthropic) == "sm"
    assert (
        requested_max_tokens({"max_output_tokens": 9}) == 9
        and requested_max_tokens({"max_tokens": 0}) is None
    )


def test_the_route_tables_are_disjoint_and_name_the_unclassified():
    assert not (ADMITTED & PASSED) and not (ADMITTED & REFUSED.keys()) and not (PASSED & REFUSED.keys())
    assert unclassified(["/v1/chat/completions", "/health", "/v1/new_thing"]) == ["/v1/new_thing"]
