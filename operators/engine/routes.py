"""Which of vLLM's HTTP routes an engine serves, and how: the gate denies by default.

vLLM's app generates on more routes than chat and completions, and each new vLLM may add one. A generating
request that passed the gate unseen would skip the weight-swap pause, carry no version and never be recorded,
so every route of the app must be named in one of three tables:
- `ADMITTED`: generating routes the gate admits (paused during a swap, counted in flight, stamped, held to the
  prompt rules, recorded per session);
- `REFUSED`: routes answered 403 with the reason given here (they generate outside any trajectory, or control
  the engine, which is the fleet's job);
- `PASSED`: routes that generate nothing (listings, health, tokenizing), served as vLLM serves them.

A route of the app in none of them is refused too (`unclassified` names them at start-up, and a test fails on
any), so a new vLLM route cannot slip past the gate.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.routing import Match

ADMITTED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})

NOT_RECORDED = "it samples outside the session recording"
REFUSED: dict[str, str] = {
    "/v1/chat/completions/batch": f"{NOT_RECORDED}: send each conversation to /v1/chat/completions",
    "/invocations": "SageMaker's entry point picks an API by the body: call /v1/chat/completions directly",
    "/generative_scoring": f"{NOT_RECORDED} and the weight-swap pause",
    "/v1/systemone": f"{NOT_RECORDED} and the weight-swap pause",
    "/cohere/v2/chat": f"{NOT_RECORDED}: use /v1/chat/completions",
    "/v1/responses/{response_id}": "responses are not stored: send the whole input with each request",
    "/v1/responses/{response_id}/cancel": "responses are not stored: background mode is not served",
    "/inference/v1/generate": f"{NOT_RECORDED}: vLLM's token-in route bypasses the session's limits",
    "/inference/v1/abort_requests": "requests are aborted by the engine that owns them",
    "/scale_elastic_ep": "the engine fleet alone scales and loads its engines",
    "/is_scaling_elastic_ep": "the engine fleet alone scales and loads its engines",
    "/v1/load_lora_adapter": "the engine fleet alone loads adapters (a caller could swap the policy)",
    "/v1/unload_lora_adapter": "the engine fleet alone loads adapters",
}

PASSED = frozenset(
    {
        "/openapi.json",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/load",
        "/version",
        "/kv_event_sources",
        "/health",
        "/metrics",
        "/ping",
        "/tokenize",
        "/detokenize",
        "/v1/models",
        "/v1/messages/count_tokens",
        "/v1/chat/completions/render",
        "/v1/messages/render",
        "/v1/completions/render",
        "/v1/responses/render",
        "/v1/chat/completions/derender",
        "/v1/completions/derender",
    }
)

CLASSIFIED = ADMITTED | REFUSED.keys() | PASSED


def route_paths(app: Any) -> list[str]:
    """The path templates of the app's routes (`/v1/responses/{response_id}`, ...), in the app's order."""
    return [path for route in app.routes if (path := getattr(route, "path", None))]


def unclassified(paths: Iterable[str]) -> list[str]:
    """The routes in none of the three tables: each is refused, and the test of the tables fails on it."""
    return sorted({p for p in paths if p not in CLASSIFIED})


def matched_route(app: Any, scope: dict[str, Any]) -> str | None:
    """The path template of the app's route that `scope` reaches, whatever its method; None for no route
    (vLLM answers 404)."""
    if scope.get("path") in CLASSIFIED:  # the common case, without matching every route
        return scope["path"]
    partial = None
    for route in app.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route.path
        if match is Match.PARTIAL and partial is None:  # the path, with another method
            partial = route.path
    return partial
