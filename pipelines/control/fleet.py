"""Engine self-healing on the driver: health checks, and a replacement on the run's current version.

Engine actors are long-lived and hold the run's weights, so Ray's own actor restart would bring one back on
the base model. The supervisor instead probes every engine each `health_check_interval` seconds: the actor
must answer within `health_check_timeout` and its vLLM core must be alive. An engine that fails is killed and
a replacement is started under the same name, held closed until the run's current version is loaded into it.
Requests that were in flight on the lost engine are sent again by their clients
(`operators.engine.client`) as soon as the name points at the replacement.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.control.runtime import EngineSet, launch_engine
from pipelines.control.weight_sync import gather
from schemas.config import Config

NAME_FREE_S = 10.0  # how long the old actor's name may take to be released after it is killed


class EngineLost(RuntimeError):
    """An engine that cannot be brought back: restarts used up, or a version with nothing to reload from."""


@dataclass
class Restore:
    """How to put a fresh engine on the current version: a directory to load, or a state dict's object ref."""

    version: int
    path: Path | None = None
    state: Any = None


class EngineSupervisor:
    """Probes the engines from a driver thread and replaces the ones that fail; `lock` is held meanwhile.

    Whoever changes the engines' weights holds `lock` too, so a replacement is never put on a version that is
    being replaced at that moment. `error` is set when an engine cannot be healed; the explorer raises it.
    """

    def __init__(
        self,
        cfg: Config,
        engines: EngineSet,
        restore: Callable[[], Restore],
        say: Callable[[str], None] = print,
        launch: Callable[[str, bool], Any] | None = None,
    ):
        """`launch(name, closed)` makes a replacement actor; by default a vLLM engine on the base model."""
        explorer = cfg.explorer
        self.engines, self.restore, self.say = engines, restore, say
        self.launch = launch or (lambda name, closed: launch_engine(cfg, name, closed=closed))
        self.interval = explorer.health_check_interval
        self.timeout = explorer.health_check_timeout
        self.max_restarts = explorer.max_engine_restarts
        self.restart_timeout = explorer.engine_restart_timeout
        self.restarts = [0] * len(engines.handles)
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def total_restarts(self) -> int:
        return sum(self.restarts)

    def start(self) -> None:
        if self.interval is not None:
            self.thread = threading.Thread(target=self._watch, name="rftflow-engine-health", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """No more checks; a replacement being started is in `engines.handles`, so stopping them stops it."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=self.timeout)
            self.thread = None

    def _watch(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - an engine that cannot be healed ends the run, loudly
                self.error = exc
                self.say(f"engine supervisor: {exc}")
                return

    def check(self) -> list[int]:
        """Probe every engine once and replace those that fail; returns their indices."""
        handles = self.engines.handles
        answered, errors = gather([h.health.remote() for h in handles], self.timeout)
        failed = [i for i in range(len(handles)) if i not in answered]  # `errors` holds theirs, in order
        for index, message in zip(failed, errors, strict=True):
            if self.stopping.is_set():
                break
            self.replace(index, message.split(": ", 1)[-1])
        return failed

    def replace(self, index: int, reason: str) -> None:
        """Kill engine `index`, start a replacement under its name and put it on the current version."""
        import ray

        name = self.engines.names[index]
        if self.restarts[index] >= self.max_restarts:
            raise EngineLost(f"{name} failed ({reason}) after {self.max_restarts} restarts; giving up")
        self.say(f"{name} is unhealthy ({reason}); replacing it")
        with self.lock:
            started = time.monotonic()
            restore = self.restore()
            self.restarts[index] += 1
            ray.kill(self.engines.handles[index], no_restart=True)
            replacement = self._launch(name, closed=restore.version > 0)
            self.engines.handles[index] = replacement
            ray.get(replacement.ready.remote(), timeout=self.restart_timeout)
            if restore.version > 0:
                ray.get(self._load(replacement, restore), timeout=self.restart_timeout)
        self.say(
            f"{name} replaced on version {restore.version} in {time.monotonic() - started:.0f} s "
            f"(restart {self.restarts[index]} of at most {self.max_restarts})"
        )

    def _launch(self, name: str, closed: bool) -> Any:
        """A new actor under `name`, once the killed one has released it."""
        deadline = time.monotonic() + NAME_FREE_S
        while True:
            try:
                return self.launch(name, closed)
            except ValueError:  # "name already taken": the old actor is not gone yet
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def _load(self, engine: Any, restore: Restore) -> Any:
        if restore.path is not None:
            return engine.load_checkpoint.remote(str(restore.path), restore.version, self.restart_timeout)
        return engine.load_state_dict.remote([restore.state], restore.version, self.restart_timeout)
