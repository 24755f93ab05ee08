"""Driver side of weight sync: find a newer version, check it, load it into every engine, or say why not.

A sync never hangs and never half-happens. Waiting for a newer version is bounded by `sync_timeout` and ends
early when the trainer says it has stopped; a version that fails its checks is refused before any engine sees
it; and if an engine fails to load, the others are put back on the weights they had, so all engines always
run one version. Only when there is nothing on disk to go back to (memory and broadcast) is a split fatal.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from operators.actors.hub import WeightHub
from operators.actors.names import NAMESPACE, answer, on_this_node
from operators.engine.checkpoints import CheckpointError, TensorMetaMap, check_checkpoint, find_checkpoints
from pipelines.control.fleet import Fleet, LoadError, WeightUpdate
from pipelines.control.sync_policy import read_trainer_status
from schemas.config import Config
from schemas.run_dir import trainer_status_path

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

    def metrics(self, failures: int) -> dict[str, float]:
        return {
            "time/sync_weight": self.seconds,
            "sync/model_version": float(self.version),
            "sync/pause_s": self.pause_s,
            "sync/bytes": float(self.nbytes),
            "sync/wait_s": self.wait_s,
            "sync/succeeded": float(self.ok),
            "sync/failed": float(failures),
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

    def __init__(self, directory: Path, expected: TensorMetaMap, trainer_status: str | None = None):
        self.directory = Path(directory)
        self.expected = expected
        self.trainer_status = trainer_status or str(trainer_status_path(self.directory))

    def latest_version(self) -> int:
        """The newest whole checkpoint's version (a corrupt one must not make every experience look stale)."""
        for step, path in reversed(find_checkpoints(self.directory)):
            try:
                check_checkpoint(path, self.expected, root=self.directory)
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
                check_checkpoint(path, self.expected, root=self.directory)
                return WeightUpdate(step, self.kind, path=path)
            if read_trainer_status(self.trainer_status).state == "stopped" or time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)


class HubSource:
    """Versions a trainer announces on the weight hub actor (`memory` or `broadcast`)."""

    def __init__(self, hub: Any, kind: str, expected: TensorMetaMap):
        self.hub, self.kind, self.expected = hub, kind, expected

    def latest_version(self) -> int:
        return answer(self.hub.latest_version.remote(), "the weight hub (latest version)")

    def next_update(self, current: int, timeout: float) -> WeightUpdate | None:
        found = ray.get(self.hub.wait_newer.remote(current, timeout))
        if found is None:
            return None
        version, payload = found
        if payload.get("kind") != self.kind:
            raise CheckpointError(
                f"version {version}: announced as {payload.get('kind')}, expected {self.kind}"
            )
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
        outcome.pause_s, outcome.nbytes = loaded.pause_s, loaded.nbytes
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
    if sync.sync_method == "checkpoint":
        source: CheckpointSource | HubSource = CheckpointSource(checkpoint_dir, expected, trainer_status)
    else:
        actor = ray.remote(WeightHub).options(
            name=hub_name, namespace=NAMESPACE, get_if_exists=True, num_cpus=0, **on_this_node()
        )
        hub = actor.remote()
        tp = cfg.explorer.rollout_model.tensor_parallel_size
        answer(hub.set_workers.remote(tp * len(fleet.names), fleet.group_backend), "the weight hub (set up)")
        source = HubSource(hub, sync.sync_method, expected)
    return WeightSyncer(source, fleet, sync.sync_timeout, preempt=sync.partial_rollout), hub
