"""Driver side of weight sync: find a newer version, check it, load it into every engine, or say why not;
and the explorer's side of it (`ExplorerSync`): when a sync falls due, the version the engines start on, and
the run's record of each sync.

A sync never hangs and never half-happens. Waiting for a newer version is bounded by `sync_timeout` and ends
early when the trainer says it has stopped; a version that fails its checks is refused before any engine sees
it; and if an engine fails to load, the others are put back on the weights they had, so all engines always
run one version. Only when there is nothing on disk to go back to (memory and broadcast) is a split fatal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from operators.actors.hub import WeightHub
from operators.actors.names import NAMESPACE, get_within, on_this_node
from operators.engine.adapters import check_adapter
from operators.engine.checkpoints import CheckpointError, TensorMetaMap, check_checkpoint, find_checkpoints
from pipelines.control.adapter_sync import checkpoint_update, initial_update, memory_update
from pipelines.control.fleet import Fleet, LoadError, WeightUpdate
from pipelines.control.state import ExplorerState
from pipelines.control.sync_policy import read_trainer_status, sync_due
from schemas.config import Config
from schemas.run_dir import RunDir, checkpoint_dir_name, trainer_status_path
from schemas.storage import Location

if TYPE_CHECKING:  # the monitor's module imports MLflow; the syncer's users (tests, benchmarks) need not
    from pipelines.control.tracking import MlflowMonitor

log = logging.getLogger(__name__)
POLL_S = 0.2


@dataclass
class SyncOutcome:
    version: int  # what every engine runs after the sync
    ok: bool
    reason: str = ""
    wait_s: float = 0.0
    pause_s: float = 0.0
    nbytes: int = 0
    seconds: float = 0.0
    probe: dict[str, float] = field(default_factory=dict)

    def metrics(self, failures: int) -> dict[str, float]:
        return {
            "time/sync_weight": self.seconds,
            "sync/model_version": float(self.version),
            "sync/pause_s": self.pause_s,
            "sync/bytes": float(self.nbytes),
            "sync/wait_s": self.wait_s,
            "sync/succeeded": float(self.ok),
            "sync/failed": float(failures),
            **{f"sync/probe_{k}": v for k, v in self.probe.items()},  # a LoRA load's delivery probe
        }


def check_meta(meta: list, expected: TensorMetaMap, where: str) -> None:
    """A trainer's announced tensors must be the model's, with its shapes (dtypes may differ in memory)."""
    names = {entry[0]: list(entry[1]) for entry in meta}
    missing = sorted(set(expected) - set(names))
    extra = sorted(set(names) - set(expected))
    if missing or extra:
        raise CheckpointError(
            f"{where}: tensors do not match the model (missing {missing[:2]}, extra {extra[:2]})"
        )
    for name, shape in names.items():
        if shape != expected[name][0]:
            raise CheckpointError(
                f"{where}: tensor '{name}' has shape {shape}, the model needs {expected[name][0]}"
            )


class CheckpointSource:
    """`global_step_N/` directories a trainer writes; N is the version."""

    kind = "checkpoint"

    def __init__(
        self,
        directory: Path,
        expected: TensorMetaMap,
        trainer_status: str | None = None,
        lora_run: Config | None = None,
    ):
        """`lora_run`: a LoRA run's config, whose checkpoints are adapters (`adapter_sync`)."""
        self.directory = Path(directory)
        self.expected = expected
        self.trainer_status = trainer_status or str(trainer_status_path(self.directory))
        self.lora_run = lora_run

    def check(self, path: Path) -> None:
        if self.lora_run is not None:
            lora = self.lora_run.model.lora
            check_adapter(
                path, Path(self.lora_run.model.model_path), lora.max_lora_rank, lora.base_model_name
            )
        else:
            check_checkpoint(path, self.expected, root=self.directory)

    def latest_version(self) -> int:
        """The newest whole checkpoint's version (a corrupt one must not make every experience look stale)."""
        for step, path in reversed(find_checkpoints(self.directory)):
            try:
                self.check(path)
            except CheckpointError:
                continue
            return step
        return 0

    def next_update(self, current: int, timeout: float) -> WeightUpdate | None:
        """The newest checkpoint above `current`, checked; None if none comes in time or the trainer stops."""
        deadline = time.monotonic() + timeout
        while True:
            newer = [(step, path) for step, path in find_checkpoints(self.directory) if step > current]
            if newer:
                step, path = newer[-1]
                if self.lora_run is not None:
                    return checkpoint_update(self.lora_run, path, step)
                check_checkpoint(path, self.expected, root=self.directory)
                return WeightUpdate(step, self.kind, path=path)
            if read_trainer_status(self.trainer_status).state == "stopped" or time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)


class HubSource:
    """Versions a trainer announces on the weight hub actor (`memory` or `broadcast`)."""

    def __init__(self, hub: Any, kind: str, expected: TensorMetaMap, lora_run: Config | None = None):
        self.hub, self.kind, self.expected, self.lora_run = hub, kind, expected, lora_run

    def latest_version(self) -> int:
        return get_within(self.hub.latest_version.remote(), "the weight hub (latest version)")

    def next_update(self, current: int, timeout: float) -> WeightUpdate | None:
        found = ray.get(self.hub.wait_newer.remote(current, timeout))
        if found is None:
            return None
        version, payload = found
        if payload.get("kind") != self.kind:
            raise CheckpointError(
                f"version {version}: announced as {payload.get('kind')}, expected {self.kind}"
            )
        if self.lora_run is not None:
            return memory_update(self.lora_run, version, payload)
        check_meta(payload["meta"], self.expected, f"version {version}")
        state = payload.get("state", [None])[0]
        bucket_bytes = payload.get("bucket_bytes")
        return WeightUpdate(version, self.kind, state=state, meta=payload["meta"], bucket_bytes=bucket_bytes)


@dataclass
class WeightSyncer:
    """Finds the trainer's next version and has the fleet load it; keeps the trainer's weight-sync group."""

    source: CheckpointSource | HubSource
    fleet: Fleet
    timeout: float
    group: dict[str, Any] | None = field(default=None)
    preempt: bool = False  # the run's `synchronizer.partial_rollout`: a shared fleet's own config may differ

    def sync(self, current: int) -> SyncOutcome:
        started = time.monotonic()
        try:
            update = self.source.next_update(current, self.timeout)
        except CheckpointError as exc:
            return self._outcome(current, False, f"refused: {exc}", started)
        if update is None:
            reason = f"no version newer than {current} within {self.timeout:g} s, or the trainer stopped"
            return self._outcome(current, False, reason, started)
        waited = time.monotonic() - started
        update.preempt = self.preempt
        try:
            loaded = self.fleet.load(update, self.timeout)
        except LoadError as exc:
            return self._outcome(current, False, str(exc), started, waited)
        if update.kind == "memory":  # the fleet keeps the ref (a replacement loads it); the hub lets go
            self.source.hub.forget_state.remote(update.version)
        outcome = self._outcome(update.version, True, "", started, waited)
        outcome.pause_s, outcome.nbytes, outcome.probe = loaded.pause_s, loaded.nbytes, loaded.probe
        return outcome

    def _outcome(
        self, version: int, ok: bool, reason: str, started: float, waited: float | None = None
    ) -> SyncOutcome:
        seconds = time.monotonic() - started
        return SyncOutcome(version, ok, reason, wait_s=seconds if waited is None else waited, seconds=seconds)


def open_weight_source(
    cfg: Config,
    fleet: Fleet,
    checkpoint_dir: Path,
    hub_name: str,
    expected: TensorMetaMap,
    trainer_status: str | None,
) -> tuple[WeightSyncer, Any]:
    """The syncer for `synchronizer.sync_method`, and the weight hub actor it made (None for checkpoints).

    Memory and broadcast versions are announced on a small named hub actor that the trainer publishes to.
    """
    sync = cfg.synchronizer
    hub = None
    lora_run = cfg if cfg.model.lora is not None else None
    if sync.sync_method == "checkpoint":
        source: CheckpointSource | HubSource = CheckpointSource(
            checkpoint_dir, expected, trainer_status, lora_run
        )
    else:
        actor = ray.remote(WeightHub).options(
            name=hub_name, namespace=NAMESPACE, get_if_exists=True, num_cpus=0, **on_this_node()
        )
        hub = actor.remote()
        tp = cfg.explorer.rollout_model.tensor_parallel_size
        workers = tp * len(fleet.names)
        get_within(hub.set_workers.remote(workers, fleet.group_backend), "the weight hub (set up)")
        source = HubSource(hub, sync.sync_method, expected, lora_run)
    return WeightSyncer(source, fleet, sync.sync_timeout, preempt=sync.partial_rollout), hub


class ExplorerSync:
    """The explorer's weight sync: the trainer's status and weight source, when a sync is due, the version the
    engines start on, and each sync's record in the run's state and metrics.

    Made with the explorer; `open` (once the engines are up) makes the weight source, so before it there is
    nothing to sync from.
    """

    def __init__(self, cfg: Config, run_dir: Location, run_name: str):
        self.config, self.run_dir = cfg, run_dir
        self.hub_name = f"{run_name}/weights"  # the weight hub a trainer publishes to (memory and broadcast)
        self.syncer: WeightSyncer | None = None
        self.hub: Any = None
        self.fleet: Fleet | None = None
        self.expected: TensorMetaMap = {}

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.config.synchronizer.checkpoint_dir or RunDir(self.run_dir).checkpoints).resolve()

    def trainer_status_source(self) -> str | None:
        sync = self.config.synchronizer
        if sync.trainer_status or sync.sync_method == "none":
            return sync.trainer_status
        if sync.sync_method == "checkpoint":
            return str(trainer_status_path(self.checkpoint_dir))
        return f"actor:{self.hub_name}"

    def need_sync(self, state: ExplorerState) -> bool:
        sync = self.config.synchronizer
        if sync.sync_method == "none":
            return False
        trainer = (
            read_trainer_status(self.trainer_status_source())
            if sync.sync_style == "dynamic_by_trainer"
            else None
        )
        return sync_due(
            sync.sync_style,
            state.latest_step,
            interval=sync.sync_interval,
            offset=sync.sync_offset,
            last_sync_step=state.last_sync_step,
            model_version=state.model_version,
            trainer=trainer,
        )

    def open(self, fleet: Fleet, expected: TensorMetaMap, state: ExplorerState) -> None:
        """The configured source, and the engines put back on the version a resumed run had reached."""
        self.fleet, self.expected = fleet, expected
        if self.config.synchronizer.sync_method != "none":
            self.syncer, self.hub = open_weight_source(
                self.config,
                fleet,
                self.checkpoint_dir,
                self.hub_name,
                expected,
                self.trainer_status_source(),
            )
        self.align_engines(state)

    def align_engines(self, state: ExplorerState) -> None:
        """Engines run the version the run has reached: a resumed run's (or a shared fleet's) may not."""
        target = state.model_version
        if self.config.model.lora is not None:
            self.align_adapter(state)
            return
        if self.fleet.version == target:
            return
        path = self.checkpoint_dir / checkpoint_dir_name(target)
        on_disk = self.syncer is not None and isinstance(self.syncer.source, CheckpointSource)
        if target > 0 and not (on_disk and path.is_dir()):
            log.warning("version %d is not on disk; going on from the base weights (version 0)", target)
            target = state.model_version = 0
        if target == 0:
            path = Path(self.config.model.model_path).resolve()
        else:
            check_checkpoint(path, self.expected, root=self.checkpoint_dir)
        try:  # part of the engines' start: bounded as a replacement's load is, not by sync_timeout
            self.fleet.load(
                WeightUpdate(target, "checkpoint", path=path), self.config.explorer.engine_restart_timeout
            )
        except LoadError as exc:
            raise RuntimeError(f"could not load version {target} from {path}: {exc}") from None

    def align_adapter(self, state: ExplorerState) -> None:
        """A LoRA run's engines on the adapter the run has reached: its checkpoint, or version 0's (the
        configured adapter, or none: a fresh adapter is the base model)."""
        target, restore = state.model_version, self.fleet.restore_point
        if restore.version == target and (restore.adapter is not None or target == 0):
            return
        path = self.checkpoint_dir / checkpoint_dir_name(target)
        if target > 0 and not path.is_dir():
            log.warning("adapter version %d is not on disk; going on from version 0", target)
            target = state.model_version = 0
        update = checkpoint_update(self.config, path, target) if target > 0 else initial_update(self.config)
        if update is None:
            return
        try:  # part of the engines' start: bounded as a replacement's load is, not by sync_timeout
            self.fleet.load(update, self.config.explorer.engine_restart_timeout)
        except LoadError as exc:
            raise RuntimeError(f"could not load adapter version {target} from {update.path}: {exc}") from None

    def reference_version(self, state: ExplorerState) -> int:
        """The trainer's newest version: what staleness is measured against when a step commits."""
        newest = self.syncer.source.latest_version() if self.syncer is not None else 0
        return max(state.model_version, newest)

    async def join_group(self, master_address: str, master_port: int, state_dict_meta: list | None) -> None:
        """Every engine worker joins the trainer's torch.distributed group (trainer rank 0; gloo or NCCL)."""
        timeout = self.config.synchronizer.sync_timeout
        await asyncio.to_thread(self.fleet.open_weight_group, master_address, master_port, timeout)
        self.syncer.group = {"address": master_address, "port": master_port, "meta": state_dict_meta}

    async def sync(self, state: ExplorerState, monitor: MlflowMonitor) -> SyncOutcome:
        """Load the trainer's newest version into every engine, or keep the current one and say why; the
        state is saved before the metrics are logged, so after a crash a sync is never logged twice."""
        sync = self.config.synchronizer
        if sync.sync_method == "broadcast" and self.syncer.group is None:
            offer = await asyncio.to_thread(ray.get, self.hub.wait_offer.remote(sync.sync_timeout))
            if offer is not None:
                await self.join_group(offer["master_address"], offer["master_port"], None)
        outcome = await asyncio.to_thread(self.syncer.sync, state.model_version)
        state.model_version = outcome.version
        state.last_sync_step = state.latest_step
        state.save(self.run_dir)
        if not outcome.ok:
            state.sync_failures += 1
            log.warning(
                "weight sync after step %d unsuccessful, exploring on with version %d: %s",
                state.latest_step,
                outcome.version,
                outcome.reason,
            )
        monitor.log_metrics(outcome.metrics(state.sync_failures), state.latest_step)
        if sync.max_staleness is not None:  # what can no longer commit in time stops sampling now
            floor = self.reference_version(state) - sync.max_staleness
            if aborted := await asyncio.to_thread(self.fleet.abort_older_than, floor):
                log.info("cancelled %d requests sampled before version %d (max_staleness)", aborted, floor)
        return outcome

    def close(self) -> None:
        """End the weight hub actor `open` made, if any."""
        if self.hub is not None:
            ray.kill(self.hub)
        self.hub = None
