"""vLLM's own OpenAI API (`/v1/chat/completions`, `/v1/completions`, `/v1/models`) served on an engine's
existing `AsyncLLM`: no second engine, no home-made server.

The app is vLLM's (`build_app` and `init_app_state`, with the arguments its own CLI parser makes). uvicorn
serves it as a task on the engine actor's event loop, on a socket bound before the server starts, so the
address is known at once (`port: 0` gives a free one). vLLM's `serve_http` is not used: it installs signal
handlers, which fail off the main thread.

HTTP requests would bypass the engine's pause, version stamp and session recording, so the whole app sits
inside `EngineGate` (`operators.engine.http_gate`), and the app's engine client is `RecordingLLM`
(`operators.engine.recording_llm`), which records the calls made under a session where they are sampled.
The gate does the key check itself (vLLM's `--api-key` is not given: it would refuse the sessions' keys).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from operators.engine.http_gate import Admission, EngineGate
from operators.engine.recording_llm import RecordingLLM
from operators.engine.routes import route_paths, unclassified
from schemas.engine_config import RolloutModelConfig

log = logging.getLogger(__name__)

SHUTDOWN_S = 5.0


@dataclass
class OpenAIServer:
    """A running endpoint: its base URL (`http://host:port/v1`), the uvicorn server to stop, the path
    templates of vLLM's app (the route tables' test reads them), and the app's model registry (vLLM's
    `OpenAIServingModels`), where each loaded adapter version is listed under its own name."""

    url: str
    served_model: str
    server: Any
    task: asyncio.Task
    routes: list[str]
    models: Any = None

    def list_adapter(self, lora: Any) -> None:
        """Serve `lora` (a `LoRARequest`) under its own name too: `/v1/models` lists it and a request naming
        it samples with that version, whichever is current. The registry is the one vLLM's own runtime
        adapter route writes, which stays refused (`routes.py`): only the engine's loads reach it."""
        if self.models is not None:
            self.models.lora_requests[lora.lora_name] = lora

    def unlist_adapter(self, name: str) -> None:
        """Stop serving an unloaded version's name (a request naming it then gets vLLM's 404)."""
        if self.models is not None:
            self.models.lora_requests.pop(name, None)

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
    llm: Any,
    cfg: RolloutModelConfig,
    model_path: str,
    port: int,
    admission: Admission,
    adapter: Callable[[], Any] = lambda: None,
) -> OpenAIServer:
    """Serve vLLM's OpenAI app for `llm` on `cfg.host:port` (0: a free port) in this event loop. `adapter`
    gives the engine's current LoRA adapter: the run's one model name samples with it (`RecordingLLM`)."""
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
        await init_app_state(RecordingLLM(llm, adapter), app.state, args, tasks)
        routes = route_paths(app)
        if unknown := unclassified(routes):
            log.warning("vLLM serves routes rftflow has not classified, refused until they are: %s", unknown)
        sock = bind(cfg.host, port)
        gate = EngineGate(app, admission, cfg.api_key, cfg.max_request_bytes)
        # log_config=None: uvicorn would otherwise dictConfig() the whole process
        config = uvicorn.Config(gate, log_config=None, log_level="warning", access_log=False, lifespan="off")
        server = uvicorn.Server(config)
    finally:
        # vLLM's server set-up raises the root logger to ERROR (seen with vllm 0.32), which would silence
        # every INFO record of the process that hosts the engine: its level is put back.
        root.setLevel(level)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    host, bound = sock.getsockname()[:2]
    url = f"http://{reachable(host)}:{bound}/v1"
    models = getattr(app.state, "openai_serving_models", None)
    return OpenAIServer(url, served_model, server, task, routes, models)


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
