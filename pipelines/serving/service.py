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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from operators.engine.checkpoints import CheckpointError
from operators.sinks.base import open_sink
from pipelines.control.checks import base_tensor_meta
from pipelines.control.fleet import EngineFleet, LoadError
from pipelines.control.rolling import roll
from pipelines.control.runtime import init_ray
from pipelines.control.trainer_run import stop_trainer
from pipelines.control.weight_sync import CheckpointSource
from pipelines.serving.commits import Committer
from pipelines.serving.engines import EnginePool
from pipelines.serving.front import Front
from pipelines.serving.store import ServeStore
from schemas.config import Config
from schemas.run_dir import RunDir

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
    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        fleet: Any | None = None,
        trainer_lr: float | None = None,
        with_trainer: bool = False,
    ):
        """`fleet`: engines already started (tests share theirs); otherwise the service starts its own.
        `with_trainer`: the reference trainer trains on each committed step, and its checkpoints are rolled
        out (checkpoint sync)."""
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.with_trainer, self.trainer_lr = with_trainer, trainer_lr
        self.trainer: tuple | None = None
        if with_trainer:
            cfg.synchronizer.sync_method = "checkpoint"
        self.fleet, self.own_fleet = fleet, fleet is None
        self.front: Front | None = None
        self.server: Any = None
        self.serving: asyncio.Task | None = None
        self.duty: asyncio.Task | None = None
        self.rolling: asyncio.Task | None = None
        self.refused: set[int] = set()  # versions whose rolling update failed: not tried again
        self.executor: ThreadPoolExecutor | None = None
        self.last_commit = time.monotonic()

    async def start(self, ray_address: str | None = None) -> Started:
        from transformers import AutoTokenizer  # heavy, deferred: --help answers without it

        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.fleet is None:
            init_ray(cfg.ray, ray_address)
            self.fleet = await asyncio.to_thread(EngineFleet(cfg, f"serve-{self.run_dir.name}").start)
            self.fleet.watch(cfg.explorer)  # dead engines are replaced, on the version all hold
        store = ServeStore(store_url(cfg, self.run_dir))
        interrupted = store.interrupt_open_sessions()
        sink = open_sink(cfg.buffer.trainer_input.experience_buffer, self.run_dir)
        ops = [op.model_dump(mode="json") for op in cfg.buffer.explorer_input.experience_ops]
        tokenizer = AutoTokenizer.from_pretrained(str(cfg.model.model_path))
        committer = Committer(store, sink, cfg.serve, ops, tokenizer)
        recovered = await asyncio.to_thread(committer.recover)
        pool = EnginePool(self.fleet.handles, cfg.serve.call_timeout)
        await pool.start()
        # every concurrent call waits in a thread for its durable write (`group_commit`): enough threads that
        # they all wait together and share one disk sync
        self.executor = ThreadPoolExecutor(cfg.serve.max_concurrent + 8, thread_name_prefix="rftflow-serve")
        self.front = Front(cfg.serve, pool, store, committer, self.executor)
        url = await self.bind()
        if self.with_trainer:
            self.trainer = self.start_trainer()
        self.duty = asyncio.create_task(self.duties())
        if cfg.synchronizer.sync_method == "checkpoint":
            self.rolling = asyncio.create_task(self.roll_duty())
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

    def checkpoint_dir(self) -> Path:
        return Path(self.cfg.synchronizer.checkpoint_dir or RunDir(self.run_dir).checkpoints).resolve()

    def start_trainer(self) -> tuple:
        """The reference trainer as a Ray actor: one GRPO update per committed step, a checkpoint each."""
        from pipelines.reference.trainer import TrainerOptions, start_trainer_actor  # heavy (torch), deferred

        cfg = self.cfg
        options = TrainerOptions(
            run_dir=self.run_dir.resolve(),
            model_path=Path(cfg.model.model_path).resolve(),
            method="checkpoint",
            checkpoint_dir=self.checkpoint_dir(),
            idle_timeout=24 * 3600.0,  # live traffic may pause for long; the front stops it
            first_version=self.fleet.version,
            timeout=cfg.synchronizer.sync_timeout,
            experience_buffer=cfg.buffer.trainer_input.experience_buffer,
            **({} if self.trainer_lr is None else {"lr": self.trainer_lr}),
        )
        return start_trainer_actor(options)

    def checkpoints(self) -> CheckpointSource:
        sync = self.cfg.synchronizer
        directory = Path(sync.checkpoint_dir or RunDir(self.run_dir).checkpoints).resolve()
        return CheckpointSource(
            directory, base_tensor_meta(Path(self.cfg.model.model_path)), sync.trainer_status
        )

    async def roll_duty(self) -> None:
        """Every `serve.health_check_interval_s`: take the fleet's replacements of dead engines, and roll out
        a newer checkpoint engine by engine while the others serve."""
        source = await asyncio.to_thread(self.checkpoints)
        while True:
            await asyncio.sleep(self.cfg.serve.health_check_interval_s)
            try:
                self.front.unpin(await self.front.pool.refresh(self.fleet.handles))
                await self.roll_newer(source)
            except Exception:  # noqa: BLE001 - logged; the front serves on, the next interval tries again
                log.exception("serve: the engines' check or rolling update failed")

    async def roll_newer(self, source: CheckpointSource) -> int | None:
        """Roll out the newest checkpoint above the engines' version; the version rolled out, if any."""
        current = self.fleet.version
        latest = await asyncio.to_thread(source.latest_version)
        if latest <= current or latest in self.refused:
            return None
        try:
            update = await asyncio.to_thread(source.next_update, current, 0.0)
            if update is None:
                return None
            pool = self.front.pool
            await asyncio.to_thread(
                roll, self.fleet, update, self.cfg.synchronizer.sync_timeout, pool.set_loading
            )
        except (LoadError, CheckpointError) as exc:
            self.refused.add(latest)
            self.front.sync_failures += 1
            log.warning(
                "serve: version %d not rolled out, every engine serves version %d: %s", latest, current, exc
            )
            return None
        await self.front.pool.refresh(self.fleet.handles)
        log.info("serve: version %d rolled out to %d engine(s)", update.version, len(self.fleet.handles))
        return update.version

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
        for task in (self.duty, self.rolling):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self.server is not None:
            self.server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.serving, 10)
        if self.front is not None:
            await self.front.close()
            self.front.store.close()
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
        if self.trainer is not None:
            await asyncio.to_thread(stop_trainer, self.trainer)
        if self.own_fleet and self.fleet is not None:
            await asyncio.to_thread(self.fleet.stop)
