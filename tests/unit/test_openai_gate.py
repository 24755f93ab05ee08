"""`EngineGate`, the ASGI wrapper that puts HTTP requests under the engine's pause, version stamp and prompt
rules, without vLLM. The app inside and the engine's admission are test doubles (named so): the gate's own
behaviour is what is checked; tests/engine/test_multi_turn.py runs it around vLLM's real app."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from operators.engine.openai_server import VERSION_HEADER, EngineGate, request_text
from schemas.errors import TaskInputError


class EchoAppDouble:
    """Stands in for vLLM's app: answers 200 with the body it was given."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        message = await receive()
        body = json.dumps({"path": scope["path"], "got": json.loads(message["body"] or b"{}")}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class AdmissionDouble:
    """Stands in for the engine actor's admission: a pause, a version, and a 10-character prompt limit."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.version, self.in_flight, self.peak = 3, 0, 0

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


def client(app, admission) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=EngineGate(app, admission)), base_url="http://engine"
    )


CHAT = {"model": "m", "messages": [{"role": "user", "content": "1+1="}]}


def test_a_generating_request_carries_the_version_at_dispatch_and_is_released():
    app, admission = EchoAppDouble(), AdmissionDouble()

    async def go() -> httpx.Response:
        async with client(app, admission) as http:
            return await http.post("/v1/chat/completions", json=CHAT)

    response = asyncio.run(go())
    assert response.status_code == 200 and response.headers[VERSION_HEADER] == "3"
    assert response.json()["got"] == CHAT  # the body reaches vLLM's app whole, after the gate read it
    assert admission.peak == 1 and admission.in_flight == 0


def test_a_request_waits_while_weights_are_swapped():
    app, admission = EchoAppDouble(), AdmissionDouble()
    admission.open.clear()  # a swap in progress

    async def go() -> tuple[int, httpx.Response]:
        async with client(app, admission) as http:
            pending = asyncio.create_task(http.post("/v1/completions", json={"prompt": "2+2="}))
            await asyncio.sleep(0.2)
            held = app.calls
            admission.version = 4  # the swap's new version, stamped before requests resume
            admission.open.set()
            return held, await pending

    held, response = asyncio.run(go())
    assert held == 0 and app.calls == 1
    assert response.headers[VERSION_HEADER] == "4"


def test_a_prompt_over_the_rules_is_answered_400_without_reaching_vllm():
    app, admission = EchoAppDouble(), AdmissionDouble()
    long = {"model": "m", "messages": [{"role": "user", "content": "1+1=" * 10}]}

    async def go() -> httpx.Response:
        async with client(app, admission) as http:
            return await http.post("/v1/chat/completions", json=long)

    response = asyncio.run(go())
    assert response.status_code == 400 and app.calls == 0
    assert "max_model_len - max_tokens=10" in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/models", "/health"])
def test_other_paths_pass_straight_through(path):
    app, admission = EchoAppDouble(), AdmissionDouble()
    admission.open.clear()  # would hold a generating request

    async def go() -> httpx.Response:
        async with client(app, admission) as http:
            return await http.get(path)

    response = asyncio.run(asyncio.wait_for(go(), 10))
    assert response.status_code == 200 and VERSION_HEADER not in response.headers


def test_request_text_gathers_every_prompt_part():
    body = {"messages": [{"content": "a"}, {"content": [{"type": "text", "text": "b"}, {"type": "image"}]}]}
    assert request_text(body) == "ab"
    assert request_text({"prompt": ["c", "d"]}) == "cd"
