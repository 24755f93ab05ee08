"""Serve mode's life cycle: the engines, the store, the front on this node, and its background duties.

`Service.start` starts Ray and the engine fleet (each serving its gated OpenAI API), opens the store (ending
the sessions a previous front left open: their keys stop working), finishes any commit a crash cut, and
binds the front. While it runs it ends idle sessions and commits by the policy (`serve.commit_every_sessions`,
`serve.commit_every_s`). `stop` closes the front, then the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from operators.sinks.base import open_sink
from pipelines.control.fleet import EngineFleet
from pipelines.control.runtime import init_ray
from pipelines.serving.commits import Committer
from pipelines.serving.engines import EnginePool
from pipelines.serving.front import Front
from pipelines.serving.store import ServeStore
from schemas.config import Config

log = logging.getLogger(__name__)
DUTY_S = 0.5  # how often the policy and the idle sessions are looked at


@dataclass
class Started:
    url: str  # http://host:port
    interrupted: list[str]  # sessions a previous front left open
    recovered: list[int]  # commits a crash cut, finished now


def store_url(cfg: Config, run_dir: Path) -> str:
    return cfg.serve.db_url or f"sqlite:///{(run_dir / 'serve.db').resolve()}"


class Service:
    def __init__(self, cfg: Config, run_dir: Path, fleet: Any | None = None):
        """`fleet`: engines already started (tests share theirs); otherwise the service starts its own."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.fleet, self.own_fleet = fleet, fleet is None
        self.front: Front | None = None
        self.server: Any = None
        self.serving: asyncio.Task | None = None
        self.duty: asyncio.Task | None = None
        self.last_commit = time.monotonic()

    async def start(self, ray_address: str | None = None) -> Started:
        from transformers import AutoTokenizer  # heavy, deferred: --help answers without it

        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.fleet is None:
            init_ray(cfg.ray, ray_address)
            self.fleet = await asyncio.to_thread(EngineFleet(cfg, f"serve-{self.run_dir.name}").start)
        store = ServeStore(store_url(cfg, self.run_dir))
        interrupted = store.interrupt_open_sessions()
        sink = open_sink(cfg.buffer.trainer_input.experience_buffer, self.run_dir)
        ops = [op.model_dump(mode="json") for op in cfg.buffer.explorer_input.experience_ops]
        tokenizer = AutoTokenizer.from_pretrained(str(cfg.model.model_path))
        committer = Committer(store, sink, cfg.serve, ops, tokenizer)
        recovered = await asyncio.to_thread(committer.recover)
        pool = EnginePool(self.fleet.handles, cfg.serve.call_timeout)
        await pool.start()
        self.front = Front(cfg.serve, pool, store, committer)
        url = await self.bind()
        self.duty = asyncio.create_task(self.duties())
        return Started(url, interrupted, recovered)

    async def bind(self) -> str:
        import uvicorn  # heavy, deferred: --help answers without it

        settings = self.cfg.serve
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((settings.host, settings.port))
        except OSError as exc:
            sock.close()
            raise OSError(
                f"cannot serve on {settings.host}:{settings.port} (serve.port): {exc.strerror}"
            ) from None
        sock.listen(256)
        sock.setblocking(False)
        config = uvicorn.Config(
            self.front.app, log_config=None, log_level="warning", access_log=False, lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.serving = asyncio.create_task(self.server.serve(sockets=[sock]))
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    async def duties(self) -> None:
        """End idle sessions; commit by the policy."""
        settings = self.cfg.serve
        while True:
            await asyncio.sleep(DUTY_S)
            try:
                await self.front.sweep()
                if await self.commit_due(settings):
                    await self.front.commit_now()
                    self.last_commit = time.monotonic()
            except Exception:  # noqa: BLE001 - a failed duty is logged and tried again, the front serves on
                log.exception("serve: a background duty failed")

    async def commit_due(self, settings: Any) -> bool:
        if (
            settings.commit_every_s is not None
            and time.monotonic() - self.last_commit >= settings.commit_every_s
        ):
            return True
        if settings.commit_every_sessions is None:
            return False
        ready = await asyncio.to_thread(self.front.store.ready_sessions)
        return ready >= settings.commit_every_sessions

    async def stop(self) -> None:
        if self.duty is not None:
            self.duty.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.duty
        if self.server is not None:
            self.server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.serving, 10)
        if self.front is not None:
            await self.front.close()
            self.front.store.close()
        if self.own_fleet and self.fleet is not None:
            await asyncio.to_thread(self.fleet.stop)
