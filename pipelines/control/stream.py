"""The training stream on the driver: start the Ray Data plan behind the step gate, release it a period at
a time, collect the rollout batches' reports through the gate, and yield each step as the committer commits
it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from functools import partial
from typing import Any

import pyarrow as pa

from operators.actors.gate import StepGate
from operators.actors.names import NAMESPACE, get_within, on_this_node
from operators.rollout.runner import runs_per_task
from operators.sinks.base import Sink
from operators.tasks.reader import TasksetPlan
from pipelines.control.feed import Feeder
from pipelines.control.fleet import Fleet
from pipelines.control.state import save_carried
from pipelines.control.steps import CommittedStep, StalenessBound, StepCommitter, committed_task_uids
from pipelines.control.sync_policy import release_boundary
from schemas.config import Config
from schemas.storage import Location

COLLECT_WAIT_S = 0.5  # how long one collect call waits on the gate for reports
DRAIN_WAIT_S = 60.0  # how long a shutdown waits for the stream's execution to end once its actors are gone
DRAIN_GRACE_S = 10.0  # how long a finished run's stream may take to end by itself (its last empty outputs)
KILL_POLL_S = 0.5  # while a stream ends: how often the gate is asked for forwarders that enlisted since

log = logging.getLogger(__name__)


def start_behind_gate(
    cfg: Config,
    plan: TasksetPlan,
    engine_names: list[str],
    sink_root: Location,
    gate_name: str,
    latest_step: int,
) -> tuple[Any, Future]:
    """The step gate actor, closed (every step after `latest_step`, the last committed one, waits), and the
    training dataset draining behind it (`drain_in_background`)."""
    import ray  # heavy, deferred: the stream's helpers import without Ray

    from pipelines.control.plan import explore_dataset  # deferred: the plan imports Ray Data

    gate = ray.remote(StepGate).options(name=gate_name, namespace=NAMESPACE, num_cpus=0, **on_this_node())
    handle = gate.remote(latest_step)
    dataset = explore_dataset(cfg, plan, engine_names, sink_root, gate_name, latest_step + 1)
    return handle, drain_in_background(dataset)


def release_period(
    cfg: Config, gate: Any, latest_step: int, num_steps: int, feeder: Feeder | None = None
) -> None:
    """Open the gate up to the end of the period `latest_step` is in (`sync_policy.release_boundary`); in a
    scheduled run, only up to the last step whose tasks the feeder could draw and post."""
    sync = cfg.synchronizer
    upto = release_boundary(
        sync.sync_method,
        sync.sync_style,
        latest_step=latest_step,
        num_steps=num_steps,
        interval=sync.sync_interval,
        offset=sync.sync_offset,
        max_staleness=sync.max_staleness,
        partial=sync.partial_rollout,
    )
    if feeder is not None:
        upto = min(upto, feeder.feed(gate, upto, latest_step))
    get_within(gate.release.remote(upto), "the step gate (release a period)")


def open_stream(
    cfg: Config,
    plan: TasksetPlan,
    sink: Sink,
    run_dir: Location,
    first: int,
    *,
    gate: Any,
    drained: Future,
    fleet: Fleet,
    on_records: Callable[[pa.Table], None],
    reference_version: Callable[[], int],
) -> Iterator[CommittedStep]:
    """The committed-step stream from step `first`, over the gate and drain `start_behind_gate` started.

    `reference_version` gives the trainer's newest version, what the staleness bound measures against; a run
    with over-rollout recycling records the tasks each step moves on (`save_carried`)."""
    repeats = runs_per_task(
        cfg.buffer.explorer_input.training_tasksets[0].repeat_times,  # the same in each (schedule_checks)
        cfg.explorer.max_repeat_times_per_runner,
    )
    committer = StepCommitter(
        plan,
        sink,
        first_step=first,
        rows_per_task=repeats,
        staleness=StalenessBound(cfg.synchronizer.max_staleness, reference_version),
        committed_uids=committed_task_uids(sink) if first > 1 else None,
        on_deferred=partial(save_carried, run_dir) if cfg.explorer.over_rollout.recycle else None,
    )
    return committed_steps(committer, drained, gate, fleet, on_records)


def drain_in_background(dataset: Any) -> Future:
    """Iterate the dataset in a daemon thread: a stream a failed run leaves behind never holds up the exit.

    Ray Data executes only while consumed; the outputs themselves are not needed (batches report to the gate).
    """
    drained: Future = Future()

    def drain() -> None:
        try:
            for _ in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
                pass
            drained.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the committing loop, which raises it
            drained.set_exception(exc)

    threading.Thread(target=drain, name="rftflow-drain", daemon=True).start()
    return drained


def end_stream(gate: Any, drained: Future | None, grace: float = 0.0) -> list[str]:
    """End a stream: wait up to `grace` for its drain to end by itself, else kill its forwarders (every actor
    that enlisted at its gate) and wait (bounded) for the drain; returns the forwarders' actor ids.

    Ray Data removes its pool once the executor ends, but a stream started behind a closed gate, or one whose
    forwarders wait on an engine for its replacement, may not end by itself for minutes. The forwarders are
    killed while the engines still run, so no call is left waiting on an engine that is going away. A
    forwarder still starting when the stream is ended enlists later: the gate is asked again while the drain
    goes on, so a stream ended just after it started ends within a poll, not at `DRAIN_WAIT_S`.
    """
    import ray  # heavy, deferred: the stream's helpers import without Ray

    def enlisted() -> dict[str, Any]:
        if gate is None:
            return {}
        return get_within(gate.forwarders.remote(), "the step gate (its forwarders)")

    killed = enlisted()
    if drained is not None and not wait([drained], timeout=grace).not_done:
        return list(killed)  # it ended by itself
    for handle in killed.values():
        ray.kill(handle, no_restart=True)
    deadline = time.monotonic() + DRAIN_WAIT_S
    while drained is not None and wait([drained], timeout=KILL_POLL_S).not_done:
        if time.monotonic() >= deadline:
            log.warning("the training stream did not end within %.0f s of shutdown", DRAIN_WAIT_S)
            break
        for actor_id, handle in enlisted().items():
            if actor_id not in killed:
                ray.kill(handle, no_restart=True)
                killed[actor_id] = handle
    return list(killed)


def committed_steps(
    committer: StepCommitter,
    drained: Future,
    gate: Any,
    fleet: Fleet,
    on_records: Callable[[pa.Table], None],
) -> Iterator[CommittedStep]:
    """Commit steps as the rollout batches report their records through the gate, from the dataset `drained`
    runs (`drain_in_background`); `on_records` sees each report (the progress bar). An engine the fleet could
    not heal, or a stream that fails, ends it."""
    if committer.done:
        return
    while not committer.done:
        if fleet.error is not None:
            raise fleet.error
        finished = drained.done()  # read before collecting, so reports sent before the end are seen
        for records in get_within(gate.collect.remote(COLLECT_WAIT_S), "the step gate (collect reports)"):
            on_records(records)
            yield from committer.add(records)
        if finished and not committer.done:
            drained.result()  # the stream's own error, if it failed
            raise RuntimeError(f"the stream ended before step {committer.next_step} was complete")
