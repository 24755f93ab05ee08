"""The training stream on the driver: run the Ray Data plan, collect the rollout batches' reports through the
step gate, and yield each step as the committer commits it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from operators.actors.names import answer
from pipelines.control.fleet import Fleet
from pipelines.control.steps import CommittedStep, StepCommitter

COLLECT_WAIT_S = 0.5  # how long one collect call waits on the gate for reports


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


def committed_steps(
    committer: StepCommitter,
    dataset: Any,
    gate: Any,
    fleet: Fleet,
    on_records: Callable[[pa.Table], None],
) -> Iterator[CommittedStep]:
    """Commit steps as the rollout batches report their records through the gate; `on_records` sees each
    report (the progress bar). An engine the fleet could not heal, or a stream that fails, ends it."""
    if committer.done:
        return
    drained = drain_in_background(dataset)
    while not committer.done:
        if fleet.error is not None:
            raise fleet.error
        finished = drained.done()  # read before collecting, so reports sent before the end are seen
        for records in answer(gate.collect.remote(COLLECT_WAIT_S), "the step gate (collect reports)"):
            on_records(records)
            yield from committer.add(records)
        if finished and not committer.done:
            drained.result()  # the stream's own error, if it failed
            raise RuntimeError(f"the stream ended before step {committer.next_step} was complete")
