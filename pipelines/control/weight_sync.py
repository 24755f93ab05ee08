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

from operators.engine.checkpoints import CheckpointError, TensorMetaMap, check_checkpoint, find_checkpoints
from pipelines.control.sync_policy import read_trainer_status

log = logging.getLogger(__name__)
POLL_S = 0.2


@dataclass
class Update:
    """A newer version, ready to load: a checked checkpoint directory, an object ref, or a broadcast."""

    version: int
    kind: str
    path: Path | None = None
    state: Any = None
    meta: list | None = None
    bucket_bytes: int | None = None  # broadcast: the sender's bucket size, which the receivers must match


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


class SyncError(RuntimeError):
    """Engines ended on different versions and nothing on disk can bring them back together."""


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
        self.trainer_status = trainer_status or str(self.directory / "trainer_status.json")

    def latest_version(self) -> int:
        """The newest whole checkpoint's version (a corrupt one must not make every experience look stale)."""
        for step, path in reversed(find_checkpoints(self.directory)):
            try:
                check_checkpoint(path, self.expected, root=self.directory)
            except CheckpointError:
                continue
            return step
        return 0

    def next_update(self, current: int, timeout: float) -> Update | None:
        """The newest checkpoint above `current`, checked; None if none comes in time or the trainer stops."""
        deadline = time.monotonic() + timeout
        while True:
            newer = [(step, path) for step, path in find_checkpoints(self.directory) if step > current]
            if newer:
                step, path = newer[-1]
                check_checkpoint(path, self.expected, root=self.directory)
                return Update(step, self.kind, path=path)
            if read_trainer_status(self.trainer_status).state == "stopped" or time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)


class HubSource:
    """Versions a trainer announces on the weight hub actor (`memory` or `broadcast`)."""

    def __init__(self, hub: Any, kind: str, expected: TensorMetaMap):
        self.hub, self.kind, self.expected = hub, kind, expected

    def latest_version(self) -> int:
        import ray

        return ray.get(self.hub.latest_version.remote())

    def next_update(self, current: int, timeout: float) -> Update | None:
        import ray

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
        return Update(version, self.kind, state=state, meta=payload["meta"], bucket_bytes=bucket_bytes)


@dataclass
class WeightSyncer:
    """Applies updates to every engine; remembers the on-disk weights the engines hold, to roll back to."""

    source: CheckpointSource | HubSource
    handles: list[Any]
    timeout: float
    on_disk: tuple[int, Path] | None = None
    in_memory: tuple[int, Any] | None = None
    group: dict[str, Any] | None = field(default=None)

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
        reports, errors = self._apply(update)
        if errors:
            self._roll_back(current, reports, errors)
            return self._outcome(current, False, "; ".join(errors), started, waited)
        self.on_disk = (update.version, update.path) if update.kind == "checkpoint" else None
        # A memory version's ref is kept (the hub lets go of it) so that a replacement engine can load it.
        self.in_memory = (update.version, update.state) if update.kind == "memory" else None
        if update.kind == "memory":
            self.source.hub.forget_state.remote(update.version)
        outcome = self._outcome(update.version, True, "", started, waited)
        outcome.pause_s = max(r["pause_s"] for r in reports.values())
        outcome.nbytes = int(max(r["bytes"] for r in reports.values()))
        return outcome

    def _outcome(
        self, version: int, ok: bool, reason: str, started: float, waited: float | None = None
    ) -> SyncOutcome:
        seconds = time.monotonic() - started
        return SyncOutcome(version, ok, reason, wait_s=seconds if waited is None else waited, seconds=seconds)

    def _apply(self, update: Update) -> tuple[dict[int, dict], list[str]]:
        """Every engine loads `update` at once (a broadcast needs them all); per-engine reports and errors."""
        if update.kind == "checkpoint":
            calls = [
                h.load_checkpoint.remote(str(update.path), update.version, self.timeout) for h in self.handles
            ]
        elif update.kind == "memory":
            calls = [
                h.load_state_dict.remote([update.state], update.version, self.timeout)  # each fetches the ref
                for h in self.handles
            ]
        else:
            calls = [
                h.receive_weights.remote(update.meta, update.version, self.timeout, update.bucket_bytes)
                for h in self.handles
            ]
        return gather(calls, self.timeout)

    def _roll_back(self, current: int, reports: dict[int, dict], errors: list[str]) -> None:
        """Put engines that loaded the new version back on `current`'s weights, or fail loudly."""
        if not reports:
            return
        if self.on_disk is None or self.on_disk[0] != current:
            raise SyncError(
                f"engines {sorted(reports)} loaded the new weights but others failed ({'; '.join(errors)}), "
                f"and version {current} is not on disk to go back to"
            )
        version, path = self.on_disk
        handles = [self.handles[i] for i in sorted(reports)]
        _, back_errors = gather(
            [h.load_checkpoint.remote(str(path), version, self.timeout) for h in handles], self.timeout
        )
        if back_errors:
            raise SyncError(f"roll-back to version {version} failed: {'; '.join(back_errors)}")


def gather(calls: list[Any], timeout: float) -> tuple[dict[int, dict], list[str]]:
    """Results of concurrent engine calls by engine index, and one message per engine that failed."""
    import ray

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
