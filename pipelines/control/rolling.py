"""A rolling weight update, for serve mode: engine by engine, while the others keep serving.

Explore mode loads every engine at once between steps (`EngineFleet.load`); a serving front cannot stop all
of them, so here one engine loads at a time and `on_loading(index, True)` tells the front to route new work
around it (with a single engine, requests wait at its own pause instead: they never fail). If engine k fails
its load, the engines already on the new version are put back, one by one too, and every engine keeps
serving the old version; the failure is raised as LoadError, for the caller to log and count. The fleet's
restore point moves to the new version only when every engine holds it.
"""

from __future__ import annotations

from collections.abc import Callable

from pipelines.control.fleet import EngineFleet, LoadError, SyncError, gather
from pipelines.control.weight_updates import Loaded, WeightUpdate


def load_one(fleet: EngineFleet, index: int, update: WeightUpdate, timeout: float) -> dict | str:
    """Engine `index` loads `update`: its report, or the error text."""
    reports, errors = gather([fleet.load_call(fleet.handles[index], update, timeout)], timeout)
    return reports[0] if reports else errors[0].replace("engine 0", f"engine {index}", 1)


def roll(
    fleet: EngineFleet, update: WeightUpdate, timeout: float, on_loading: Callable[[int, bool], None]
) -> Loaded:
    """Load `update` into every engine of `fleet`, one at a time; LoadError (all back on the old version)
    when one fails, SyncError when even the roll-back fails."""
    with fleet.lock:
        done: list[int] = []
        pause, nbytes = 0.0, 0
        for index in range(len(fleet.handles)):
            on_loading(index, True)
            try:
                report = load_one(fleet, index, update, timeout)
            finally:
                on_loading(index, False)
            if isinstance(report, str):
                back(fleet, done, timeout, on_loading, report)
                raise LoadError(f"version {update.version}: {report}; engines {done} put back")
            done.append(index)
            pause, nbytes = max(pause, report["pause_s"]), max(nbytes, int(report["bytes"]))
        fleet.current = update.restore_point()
    return Loaded(pause_s=pause, nbytes=nbytes)


def back(
    fleet: EngineFleet, done: list[int], timeout: float, on_loading: Callable[[int, bool], None], why: str
) -> None:
    """Put the engines in `done` back on the fleet's restore point, one at a time."""
    if done and not fleet.current.loadable:
        raise SyncError(
            f"engines {done} loaded the new weights but {why}, and there is nothing to go back to"
        )
    for index in done:
        on_loading(index, True)
        try:
            report = load_one(fleet, index, fleet.current.as_update(), timeout)
        finally:
            on_loading(index, False)
        if isinstance(report, str):
            raise SyncError(f"roll-back to version {fleet.current.version} failed: {report}")
