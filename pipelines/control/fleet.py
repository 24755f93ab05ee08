"""`EngineFleet`: the one owner of the engines. Only this module starts, probes, replaces, loads weights into,
reads weights from and stops the vLLM engine actors (`launch.py` makes each actor and its placement group).

Engines are long-lived and hold weights that change during a run (a weight sync, a benchmark's checkpoint), so
Ray's own actor restart would bring one back on the base model. The fleet keeps a *restore point* instead: the
version every engine holds and where to load it from. Every load goes through `load()`, under one lock, and
moves the restore point; a health thread probes each engine every `health_check_interval` seconds, and an
engine that fails is killed and replaced under the same name, held closed until the restore point is loaded
into it. Because the eval, the bench and the weight syncer all load through here, a replacement always comes
back on the weights its clients are using at that moment. Requests in flight on a lost engine are sent again
by their clients (`operators.engine.client`) once the name points at the replacement.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from operators.actors.names import ACTOR_CALL_S, get_within
from pipelines.control.launch import EngineLauncher, check_resources, launch_when_free, resolve_device
from pipelines.control.weight_updates import Loaded, Restore, WeightUpdate
from schemas.config import Config, ExplorerConfig

log = logging.getLogger(__name__)
COUNTERS_CALL_S = 5.0  # counter reads and aborts are quick: an engine silent for 5 s is left out


class EngineLost(RuntimeError):
    """An engine that cannot be brought back: restarts used up, or a version with nothing to reload from."""


class LoadError(RuntimeError):
    """Some engines failed to load a version; the others were put back on the restore point."""


class SyncError(RuntimeError):
    """Engines ended on different versions and nothing can bring them back together."""


class Fleet(Protocol):
    """What the explorer, eval, the bench and the weight syncer need of the engines (tests double this)."""

    names: list[str]

    @property
    def restore_point(self) -> Restore: ...

    @property
    def restarts(self) -> int: ...

    @property
    def error(self) -> BaseException | None: ...

    def load(self, update: WeightUpdate, timeout: float) -> Loaded: ...

    def get_weight(self, name: str) -> Any: ...

    def open_weight_group(self, address: str, port: int, timeout: float) -> None: ...

    @property
    def group_backend(self) -> str: ...


def gather(calls: list[Any], timeout: float) -> tuple[dict[int, dict], list[str]]:
    """Results of concurrent engine calls by engine index, and one message per engine that failed."""
    import ray  # heavy, deferred: the driver's modules import without Ray

    ray.wait(calls, num_returns=len(calls), timeout=timeout)
    reports, errors = {}, []
    for i, call in enumerate(calls):
        try:
            reports[i] = ray.get(call, timeout=0)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(call)
            errors.append(f"engine {i}: no answer within {timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - each engine's failure is reported, not raised
            errors.append(f"engine {i}: {type(exc).__name__}: {str(exc).splitlines()[-1][:300]}")
    return reports, errors


def worst_probe(reports: list[dict]) -> dict[str, float]:
    """An adapter load's delivery probe across engines: the largest distance to the adapter, the smallest to
    the base, and the longest the check took (`check_s`: its share of a sync is what it costs)."""
    adapter = [r["adapter_d"] for r in reports if "adapter_d" in r]
    if not adapter:
        return {}
    return {
        "adapter_d": max(adapter),
        "base_d": min(r["base_d"] for r in reports if "base_d" in r),
        "check_s": max(r.get("probe_s", 0.0) for r in reports),
    }


class EngineFleet:
    """The run's engine actors, their weights and their health; see the module docstring.

    `names` are what Ray Data operators get (plain strings); handles never leave this class.
    """

    def __init__(
        self,
        cfg: Config,
        run_name: str,
        launch: Callable[[str, bool], Any] | None = None,
    ):
        """`launch(name, closed)` makes an engine actor; by default a vLLM engine on the base model."""
        self.cfg = cfg
        self.base = Path(cfg.model.model_path).resolve()
        self.names = [f"{run_name}/engine-{i}" for i in range(cfg.explorer.rollout_model.engine_num)]
        self.launcher = EngineLauncher(cfg, self.names)
        self.launch_one = launch or self.launch_placed
        self.handles: list[Any] = []
        self.lock = threading.RLock()
        self.current = Restore(0, path=self.base)
        self.group: dict[str, Any] | None = None  # the trainer's weight-sync group, once joined
        self.restarts_per_engine = [0] * len(self.names)
        self.failure: BaseException | None = None
        self.settings: ExplorerConfig = cfg.explorer
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        # wall-clock times (time.time()) of `launch()` and of `wait()` returning: when the engines were ready
        # is where an engine-excluded clock starts (`benchmarks/pipeline_vs_engine.py`)
        self.launched_at: float | None = None
        self.ready_at: float | None = None

    # -- life cycle --------------------------------------------------------------------------------------

    def launch(self) -> None:
        """Create the actors; they load the model in the background (`wait()` blocks until they have)."""
        if not self.handles:
            check_resources(self.cfg)
            self.launched_at = time.time()
            for name in self.names:  # one by one: a refused placement leaves those made so far to `stop()`
                self.handles.append(self.launch_one(name, False))

    def wait(self) -> None:
        """Block until every engine has loaded its model, so start errors surface here with their reason;
        at most `engine_restart_timeout` seconds, which an engine start may take."""
        import ray  # heavy, deferred: the driver's modules import without Ray

        timeout = self.settings.engine_restart_timeout
        try:
            ray.get([engine.ready.remote() for engine in self.handles], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the engines {self.names} did not start within {timeout:g} s "
                "(explorer.engine_restart_timeout): still loading the model, or waiting for resources"
            ) from None
        self.ready_at = time.time()
        if self.launched_at is not None:
            log.info(
                "%d engine(s) ready %.1f s after launch", len(self.handles), self.ready_at - self.launched_at
            )

    def start(self) -> EngineFleet:
        """Launch and wait; engines that fail to start are not left behind."""
        try:
            self.launch()
            self.wait()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def started(self) -> bool:
        return bool(self.handles)

    def stop(self) -> None:
        """Stop watching, then free the engines' memory now rather than when the driver exits."""
        import ray  # heavy, deferred: the driver's modules import without Ray

        self.unwatch()
        with contextlib.suppress(Exception):  # a dead or stuck engine is killed below all the same
            ray.get([engine.shutdown.remote() for engine in self.handles], timeout=30)
        for engine in self.handles:
            ray.kill(engine)
        self.handles = []
        for index in range(len(self.names)):
            self.launcher.release(index)

    # -- weights -----------------------------------------------------------------------------------------

    @property
    def restore_point(self) -> Restore:
        return self.current

    @property
    def version(self) -> int:
        return self.current.version

    def load(self, update: WeightUpdate, timeout: float) -> Loaded:
        """Every engine loads `update` at once (a broadcast needs them all), or none keeps it.

        If some engines fail, those that loaded are put back on the restore point and LoadError says why;
        SyncError when that is impossible (a broadcast version, or the roll-back failed).
        """
        if (update.adapter is None) != (self.cfg.model.lora is None):
            raise LoadError(
                f"version {update.version}: "
                + ("full weights in a LoRA run" if self.cfg.model.lora else "an adapter in a full-weight run")
                + " (model.lora decides which a run syncs; they cannot be mixed)"
            )
        with self.lock:
            reports, errors = gather([self.load_call(h, update, timeout) for h in self.handles], timeout)
            if errors:
                self.roll_back(sorted(reports), errors, timeout)
                raise LoadError("; ".join(errors))
            self.current = update.restore_point()
        return Loaded(
            pause_s=max((r["pause_s"] for r in reports.values()), default=0.0),
            nbytes=int(max((r["bytes"] for r in reports.values()), default=0)),
            probe=worst_probe(list(reports.values())),
        )

    def load_call(self, engine: Any, update: WeightUpdate, timeout: float) -> Any:
        """The engine's load of `update`, as an object ref (each engine fetches a state dict by its ref)."""
        cut, spec = update.preempt, update.adapter
        if spec is not None and update.kind == "checkpoint":
            args = (str(update.path), update.version, spec.name, spec.probe, spec.keep, timeout, cut)
            return engine.load_adapter.remote(*args)
        if spec is not None:
            args = (
                [update.state],
                spec.config,
                update.version,
                spec.name,
                spec.probe,
                spec.keep,
                timeout,
                cut,
            )
            return engine.load_adapter_state.remote(*args)
        if update.kind == "checkpoint":
            return engine.load_checkpoint.remote(str(update.path), update.version, timeout, cut)
        if update.kind == "memory":
            return engine.load_state_dict.remote([update.state], update.version, timeout, cut)
        return engine.receive_weights.remote(update.meta, update.version, timeout, update.bucket_bytes, cut)

    def roll_back(self, loaded: list[int], errors: list[str], timeout: float) -> None:
        """Put the engines that loaded a refused version back on the restore point, or fail loudly."""
        if not loaded:
            return
        if not self.current.loadable:
            raise SyncError(
                f"engines {loaded} loaded the new weights but others failed ({'; '.join(errors)}), and "
                f"version {self.current.version} came by broadcast: there is nothing to go back to"
            )
        back = self.current
        _, back_errors = gather(
            [self.load_call(self.handles[i], back.as_update(), timeout) for i in loaded], timeout
        )
        if back_errors:
            raise SyncError(f"roll-back to version {back.version} failed: {'; '.join(back_errors)}")

    def get_weight(self, name: str) -> Any:
        """The named parameter as the first engine holds it (vLLM's parameter names, the engine's dtype)."""

        return get_within(self.handles[0].get_weight.remote(name), f"{self.names[0]} (get_weight {name})")

    @property
    def group_backend(self) -> str:
        return "nccl" if resolve_device(self.cfg) == "gpu" else "gloo"

    def open_weight_group(self, address: str, port: int, timeout: float) -> None:
        """Every engine worker joins the trainer's torch.distributed group (trainer rank 0; gloo or NCCL)."""

        tp = self.cfg.explorer.rollout_model.tensor_parallel_size
        world = 1 + tp * len(self.handles)
        calls = [
            engine.open_weight_group.remote(address, port, 1 + i * tp, world, self.group_backend, timeout)
            for i, engine in enumerate(self.handles)
        ]
        with self.lock:
            get_within(calls, "the engines (join the weight-sync group)", timeout + ACTOR_CALL_S)
            self.group = {"address": address, "port": port}

    def counters(self) -> dict[str, float]:
        """The engines' running totals, summed (`VLLMEngine.counters`); a replaced engine counts afresh."""
        answered, _ = gather([h.counters.remote() for h in self.handles], COUNTERS_CALL_S)
        totals: Counter[str] = Counter()
        for counts in answered.values():
            totals.update(counts)  # the keys are the engine's own: nothing to keep in step here
        return dict(totals)

    def abort_older_than(self, version: int) -> int:
        """Abort, on every engine, the requests dispatched before `version`; returns how many."""
        answered, errors = gather([h.abort_older_than.remote(version) for h in self.handles], COUNTERS_CALL_S)
        for error in errors:
            log.warning("aborting hopeless requests: %s", error)
        return int(sum(answered.values()))

    # -- health ------------------------------------------------------------------------------------------

    @property
    def restarts(self) -> int:
        return sum(self.restarts_per_engine)

    @property
    def error(self) -> BaseException | None:
        """Set when an engine could not be healed; clients raise it."""
        return self.failure

    def watch(self, settings: ExplorerConfig | None = None) -> None:
        """Probe the engines from a driver thread, with the caller's health settings (`explorer.*`)."""
        self.settings = settings or self.settings
        if self.thread is None and self.settings.health_check_interval is not None:
            self.stopping.clear()
            self.thread = threading.Thread(target=self.watch_loop, name="rftflow-engine-health", daemon=True)
            self.thread.start()

    def unwatch(self) -> None:
        """No more checks; a replacement being started is in `handles`, so `stop()` stops it too."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=self.settings.health_check_timeout)
            self.thread = None

    def watch_loop(self) -> None:
        while not self.stopping.wait(self.settings.health_check_interval):
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - an engine that cannot be healed ends the run, loudly
                self.failure = exc
                log.error("engine fleet: %s", exc)
                return

    def check(self) -> list[int]:
        """Probe every engine once and replace those that fail; returns their indices."""
        handles = list(self.handles)
        answered, errors = gather([h.health.remote() for h in handles], self.settings.health_check_timeout)
        failed = [i for i in range(len(handles)) if i not in answered]  # `errors` holds theirs, in order
        for index, message in zip(failed, errors, strict=True):
            if self.stopping.is_set():
                break
            self.replace(index, message.split(": ", 1)[-1])
        return failed

    def replace(self, index: int, reason: str) -> None:
        """Kill engine `index`, start a replacement under its name and put it on the restore point."""
        import ray  # heavy, deferred: the driver's modules import without Ray

        name, limit = self.names[index], self.settings.max_engine_restarts
        timeout = self.settings.engine_restart_timeout
        if self.restarts_per_engine[index] >= limit:
            raise EngineLost(f"{name} failed ({reason}) after {limit} restarts; giving up")
        log.warning("%s is unhealthy (%s); replacing it", name, reason)
        with self.lock:
            started, restore = time.monotonic(), self.current
            if not restore.loadable:
                raise EngineLost(
                    f"version {restore.version} came by broadcast and cannot be loaded into a replacement "
                    "engine; the run stops here with its committed steps kept (rerun with the same --run-dir "
                    "to resume)"
                )
            fresh = restore.path != self.base
            self.restarts_per_engine[index] += 1
            ray.kill(self.handles[index], no_restart=True)
            self.launcher.release(index)  # its node may be gone: the replacement chooses afresh
            replacement = launch_when_free(self.launch_one, name, closed=fresh)
            self.handles[index] = replacement
            ray.get(replacement.ready.remote(), timeout=timeout)
            if fresh:
                ray.get(self.load_call(replacement, restore.as_update(), timeout), timeout=timeout)
        log.warning(
            "%s replaced on version %d in %.0f s (restart %d of at most %d)",
            name,
            restore.version,
            time.monotonic() - started,
            self.restarts_per_engine[index],
            limit,
        )

    # -- placement ---------------------------------------------------------------------------------------

    def launch_placed(self, name: str, closed: bool) -> Any:
        """The default launch (`launch.EngineLauncher`), its placement waiting at most as an engine start."""
        return self.launcher.launch(self.names.index(name), closed, self.settings.engine_restart_timeout)
