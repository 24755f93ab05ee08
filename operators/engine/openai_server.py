"""vLLM's own OpenAI API (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) served on an engine's
existing `AsyncLLM`: no second engine, no home-made server.

The app is vLLM's (`build_app` and `init_app_state`, with the arguments its own CLI parser makes). uvicorn
serves it as a task on the engine actor's event loop, on a socket bound before the server starts, so the
address is known at once (`port: 0` gives a free one). vLLM's `serve_http` is not used: it installs signal
handlers, which fail off the main thread.

HTTP requests would bypass the engine's pause and version stamp, so the whole app sits inside `EngineGate`
(vLLM's `add_middleware` cannot be used once its app is built). A generating request is admitted like any
other: it waits while weights are swapped, counts as in flight, and its response carries the engine's model
version at dispatch in the `x-rftflow-model-version` header. A prompt over the length rules is answered 400
before vLLM tokenizes it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from schemas.engine_config import RolloutModelConfig
from schemas.errors import TaskInputError

GENERATING = frozenset({"/v1/chat/completions", "/v1/completions"})
VERSION_HEADER = "x-rftflow-model-version"
MAX_BODY_BYTES = 64 * 2**20  # a request body past this is refused unread (413), not buffered
SHUTDOWN_S = 5.0

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Admission(Protocol):
    """What the gate needs from the engine: its pause, its version and its prompt rules."""

    async def admit(self) -> int:
        """Wait while weights are swapped, count the request in flight; the model version at dispatch."""
        ...

    async def release(self) -> None: ...

    def check_request(self, body: dict[str, Any]) -> None:
        """Raise TaskInputError for a request the engine's prompt rules refuse."""
        ...


def request_text(body: dict[str, Any]) -> str:
    """All prompt text of a chat or completions request body (message contents, text parts, the prompt)."""
    parts: list[str] = []
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt)
    elif isinstance(prompt, list):
        parts += [p for p in prompt if isinstance(p, str)]
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [
                p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
    return "".join(parts)


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def send_error(send: Send, status: int, message: str) -> None:
    """An error as vLLM's server writes one (the OpenAI client raises it as BadRequestError and the like)."""
    kind = "BadRequestError" if status == 400 else "RequestTooLarge"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class EngineGate:
    """The ASGI app around vLLM's: admission, the version header, and the prompt rules, for generating
    requests; every other path (`/v1/models`, `/health`, ...) goes straight through."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], admission: Admission):
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in GENERATING:
            await self.app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > MAX_BODY_BYTES:
                await send_error(send, 413, f"request body over {MAX_BODY_BYTES >> 20} MiB")
                return
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            parsed = json.loads(body) if body else {}
            if isinstance(parsed, dict):
                self.admission.check_request(parsed)
        except TaskInputError as exc:
            await send_error(send, 400, str(exc))
            return
        except ValueError:
            pass  # not JSON: vLLM answers it with its own 400
        await self.serve(scope, body, receive, send)

    async def serve(self, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when the client goes

        version = await self.admission.admit()

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (VERSION_HEADER.encode(), str(version).encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, replay, stamped)
        finally:
            await self.admission.release()


@dataclass
class OpenAIServer:
    """A running endpoint: its base URL (`http://host:port/v1`) and the uvicorn server to stop."""

    url: str
    served_model: str
    server: Any
    task: asyncio.Task

    async def stop(self) -> None:
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), SHUTDOWN_S)
        except (TimeoutError, asyncio.CancelledError):
            self.task.cancel()


def vllm_server_args(cfg: RolloutModelConfig, model_path: str, served_model: str) -> Any:
    """vLLM's server arguments, made by its own parser (so every default is vLLM's)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser  # heavy, deferred: engine process only
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # heavy, deferred: as above

    argv = ["--model", model_path, "--served-model-name", served_model, "--disable-uvicorn-access-log"]
    argv += ["--max-model-len", str(cfg.max_model_len)]
    if cfg.api_key is not None:
        argv += ["--api-key", cfg.api_key]
    if cfg.tool_call_parser is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", cfg.tool_call_parser]
    if cfg.reasoning_parser is not None:
        argv += ["--reasoning-parser", cfg.reasoning_parser]
    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot serve the OpenAI API on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def start_server(
    llm: Any, cfg: RolloutModelConfig, model_path: str, port: int, admission: Admission
) -> OpenAIServer:
    """Serve vLLM's OpenAI app for `llm` on `cfg.host:port` (0: a free port) in this event loop."""
    import uvicorn  # heavy, deferred: engine process only
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state  # heavy, deferred: as uvicorn
    from vllm.entrypoints.launchers.app import build_app  # heavy, deferred: as uvicorn

    served_model = Path(model_path).name
    root = logging.getLogger()
    level = root.level
    try:
        args = vllm_server_args(cfg, model_path, served_model)
        tasks = await llm.get_supported_tasks()
        app = build_app(args, tasks, llm.model_config)
        await init_app_state(llm, app.state, args, tasks)
        sock = bind(cfg.host, port)
        # log_config=None: uvicorn would otherwise dictConfig() the whole process
        config = uvicorn.Config(
            EngineGate(app, admission), log_config=None, log_level="warning", access_log=False, lifespan="off"
        )
        server = uvicorn.Server(config)
    finally:
        # vLLM's server set-up raises the root logger to ERROR (seen with vllm 0.32), which would silence
        # every INFO record of the process that hosts the engine: its level is put back.
        root.setLevel(level)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    host, bound = sock.getsockname()[:2]
    return OpenAIServer(f"http://{reachable(host)}:{bound}/v1", served_model, server, task)


def reachable(host: str) -> str:
    """The address clients use for a socket bound to `host`: this node's own for a wildcard, as Ray knows it
    when the engine runs on a Ray node (agents on other nodes reach it there; the host name may resolve to a
    loopback address such as 127.0.1.1)."""
    if host in ("0.0.0.0", "::"):
        host = node_address()
    return f"[{host}]" if ":" in host else host


def node_address() -> str:
    import ray  # heavy, deferred: engine process only

    if ray.is_initialized():
        return ray.util.get_node_ip_address()
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
