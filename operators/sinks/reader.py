"""The trainer's view of a run's experiences: committed steps only, in order, from either sink.

    from operators.sinks.reader import open_reader

    reader = open_reader("runs/explore-20261202-130000")  # finds the store in the run's config.yaml
    for step, experiences in reader.steps(follow=True, idle_timeout=600):
        train_on(experiences)  # a pyarrow Table with schemas.experience.EXPERIENCE_SCHEMA

A step is visible once its commit is (a folder rename for Parquet, its marker object for Parquet on an object
store, a transaction for SQL), so a reader never sees a pending fragment or half a step. The run dir may be an
object-store URI (`s3://bucket/runs/x?...`, see `schemas.storage`). A following reader ends once the run's
explorer has marked it finished (`schemas.run_end`) and every committed step is read, without waiting out
its idle timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

import pyarrow as pa

from operators.sinks.base import Sink, open_sink
from schemas.config import ExperienceBufferConfig, load_config
from schemas.errors import InputError
from schemas.run_dir import CONFIG
from schemas.run_end import finished_step
from schemas.secrets import MASK
from schemas.storage import Location, as_location, display, fetched, is_file, join

POLL_S = 0.5


class ExperienceReader:
    def __init__(self, sink: Sink, finished: Callable[[], int | None] | None = None):
        """`finished`: the run's last step once its explorer has marked it finished, else None; without it a
        following reader ends only on `stop` or its idle timeout."""
        self.sink = sink
        self.finished = finished or (lambda: None)

    def committed_steps(self) -> list[int]:
        return self.sink.committed_steps()

    def read_step(self, step: int) -> pa.Table:
        """A committed step's experiences; a step not committed (yet) is an error, never a partial table."""
        if step not in self.committed_steps():
            raise KeyError(f"step {step} is not committed in {self.sink.describe()}")
        return self.sink.read_step(step)

    def steps(
        self,
        start: int = 1,
        *,
        follow: bool = False,
        poll_s: float = POLL_S,
        idle_timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[tuple[int, pa.Table]]:
        """`(step, experiences)` for each committed step from `start`, in order.

        Without `follow` it ends at the last step committed now; with it, it waits for new steps until the run
        is marked finished (and its steps are read), `stop` is set, or none commits for `idle_timeout` seconds
        (None: for ever).
        """
        last = start - 1
        while True:
            step = self._poll(
                lambda steps, last=last: min((s for s in steps if s > last), default=None),
                follow,
                poll_s,
                idle_timeout,
                stop,
            )
            if step is None:
                return
            yield step, self.sink.read_step(step)
            last = step

    def wait_for(
        self,
        step: int,
        *,
        poll_s: float = POLL_S,
        timeout: float | None = None,
        stop: threading.Event | None = None,
    ) -> bool:
        """True once `step` is committed; False when the run finished without it, `stop` is set or `timeout`
        passes first."""
        return (
            self._poll(lambda steps: step if step in steps else None, True, poll_s, timeout, stop) is not None
        )

    def _poll(
        self,
        pick: Callable[[list[int]], int | None],
        follow: bool,
        poll_s: float,
        timeout: float | None,
        stop: threading.Event | None,
    ) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        stop = stop or threading.Event()
        while True:
            ended = self.finished() is not None  # looked at first: the mark comes after the last commit
            found = pick(self.committed_steps())
            if found is not None or not follow or ended:
                return found
            if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                return None
            stop.wait(poll_s)


def buffer_config(run_dir: Location) -> ExperienceBufferConfig:
    """The experience store of the run in `run_dir`, as its explorer wrote it in config.yaml."""
    path = join(as_location(run_dir), CONFIG)
    if not is_file(path):
        raise InputError(
            "no config.yaml: not an explore run dir, or its explorer has not started yet", file=display(path)
        )
    with fetched(path) as local:
        buffer = load_config(local).buffer.trainer_input.experience_buffer
    if buffer.path is not None and f":{MASK}@" in buffer.path:
        raise InputError(
            "the run's store URL carries a password, which config.yaml holds masked: pass the store to "
            "open_reader(run_dir, config), or give the password as ${oc.env:NAME} in the run's config",
            file=display(path),
        )
    return buffer


def open_reader(run_dir: Location, config: ExperienceBufferConfig | None = None) -> ExperienceReader:
    """A reader of the run in `run_dir`; its store comes from `config`, else from the run's config.yaml."""
    run_dir = as_location(run_dir)
    sink = open_sink(config or buffer_config(run_dir), run_dir)
    return ExperienceReader(sink, partial(finished_step, run_dir))
