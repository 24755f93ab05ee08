"""Committed steps fed to a bounded Ray queue, for a trainer in the same cluster.

The queue is a named actor, `<run name>/experience_queue`, holding at most `capacity` steps as
`(step, experiences)`. A full queue holds the explorer back (back-pressure): it cannot run further ahead of
the trainer than that, and the queue's memory stays bounded. Every step in the queue is already committed
in the store, so a step that waits too long fails the run without losing anything.

The end of the stream is a marker; the explorer removes the queue once the trainer has read up to it (or
has stopped reading). The actor is detached: if the explorer dies outright, the queue and the steps in it
outlive it, and a resumed explorer goes on feeding it, republishing the committed steps it never got.
A step can then arrive twice; `QueueReader` drops the second copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from operators.actors.names import ACTOR_CALL_S, NAMESPACE, get_within, on_this_node
from operators.sinks.base import Sink
from schemas.config import ExperienceBufferConfig

END = "end-of-stream"
POLL_S = 1.0
GONE_S = 30.0  # how long a killed queue may take to release its name


def queue_name(run_name: str) -> str:
    return f"{run_name}/experience_queue"


class ExperienceQueue:
    """The queue actor (async, so a put waiting for room and a get run side by side); plain Python to test."""

    def __init__(self, capacity: int):
        self.items: asyncio.Queue = asyncio.Queue(capacity)
        self.steps = 0  # steps in the queue, the end marker not counted
        self.reader_left = asyncio.Event()

    async def put(self, item: Any, timeout: float) -> bool:
        """False when the queue stayed full for `timeout` seconds."""
        try:
            await asyncio.wait_for(self.items.put(item), timeout)
        except TimeoutError:
            return False
        self.steps += item != END
        return True

    async def get(self, timeout: float) -> list[Any]:
        """The next item, as a list of one; empty when none came within `timeout` seconds."""
        self.reader_left.clear()
        try:
            item = await asyncio.wait_for(self.items.get(), timeout)
        except TimeoutError:
            return []
        self.steps -= item != END
        return [item]

    def size(self) -> int:
        return self.steps

    def leave(self) -> None:
        """The reader is done: it took the end marker, or stopped reading."""
        self.reader_left.set()

    async def wait_reader(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.reader_left.wait(), timeout)
        except TimeoutError:
            return False
        return True


class QueueFeed:
    """The explorer's end of the queue: publish committed steps, then close the stream."""

    def __init__(self, run_name: str, capacity: int, timeout: float, store: str):
        import ray  # heavy, deferred: the driver and the trainer import this module without Ray

        self.name, self.timeout, self.store = queue_name(run_name), timeout, store
        self.actor = (
            ray.remote(ExperienceQueue)
            .options(
                name=self.name,
                namespace=NAMESPACE,
                num_cpus=0,
                lifetime="detached",
                get_if_exists=True,
                **on_this_node(),
            )
            .remote(capacity)
        )

    def publish(self, step: int, experiences: pa.Table) -> None:
        """Put a committed step in the queue, waiting while it is full, up to the queue timeout."""
        import ray  # heavy, deferred: the driver and the trainer import this module without Ray

        if not ray.get(self.actor.put.remote((step, experiences), self.timeout)):
            raise RuntimeError(
                f"step {step} is committed in {self.store}, but the experience queue {self.name} stayed "
                f"full for {self.timeout:g} s: is a trainer reading it? (raise buffer.trainer_input."
                "experience_buffer.queue_timeout, or have the trainer read the store)"
            )

    def catch_up(self, sink: Sink, published: int, known: dict[int, pa.Table] | None = None) -> int:
        """Publish the committed steps after `published`, in order; returns the last one published.

        Steps in `known` go as given; the others (a resumed run's) are read from the store.
        """
        known = known or {}
        for step in sink.committed_steps():
            if step > published:
                self.publish(step, known[step] if step in known else sink.read_step(step))
                published = step
        return published

    def close(self, drain: bool) -> int:
        """Remove the queue; with `drain`, first end the stream and wait for the trainer to read it all.

        Returns how many steps no trainer took (they stay in the store). Both waits share the queue timeout.
        """
        import ray  # heavy, deferred: the driver and the trainer import this module without Ray

        deadline = time.monotonic() + self.timeout
        try:
            if drain and get_within(
                self.actor.put.remote(END, self.timeout), self.name, self.timeout + ACTOR_CALL_S
            ):
                left = max(0.0, deadline - time.monotonic())
                get_within(
                    self.actor.wait_reader.remote(left),
                    f"{self.name} (wait for the reader)",
                    left + ACTOR_CALL_S,
                )
            return get_within(self.actor.size.remote(), f"{self.name} (size)")
        finally:
            ray.kill(self.actor)
            self._wait_gone()

    def _wait_gone(self) -> None:
        """Until the name is free: a run resumed at once must get a new queue, not this dying one."""
        import ray  # heavy, deferred: the driver and the trainer import this module without Ray

        deadline = time.monotonic() + GONE_S
        while time.monotonic() < deadline:
            try:
                ray.get_actor(self.name, namespace=NAMESPACE)
            except ValueError:
                return
            time.sleep(0.05)


def open_feed(cfg: ExperienceBufferConfig, run_name: str, store: str) -> QueueFeed | None:
    """The run's queue feed, when `queue_capacity` asks for one."""
    if cfg.queue_capacity is None:
        return None
    return QueueFeed(run_name, cfg.queue_capacity, cfg.queue_timeout, store)


class QueueReader:
    """The trainer's end: `(step, experiences)` in order until the end of the stream, each step once.

    Steps up to `after` (what the trainer already has) are skipped. Iteration also ends when `stop` is set, or
    when nothing arrives for `idle_timeout` seconds (None: wait for ever), also while the queue does not exist
    yet. One reader per queue.
    """

    def __init__(
        self,
        run_name: str,
        *,
        after: int = 0,
        poll_s: float = POLL_S,
        idle_timeout: float | None = None,
        stop: threading.Event | None = None,
    ):
        self.name, self.last, self.poll_s = queue_name(run_name), after, poll_s
        self.idle_timeout, self.stop = idle_timeout, stop or threading.Event()

    def __iter__(self) -> Iterator[tuple[int, pa.Table]]:
        import ray  # heavy, deferred: the driver and the trainer import this module without Ray

        actor = self._attach()
        if actor is None:
            return
        try:
            idle_since = time.monotonic()
            while not self.stop.is_set():
                got = self._get(actor)
                if not got:
                    if self._idle(idle_since):
                        return
                    continue
                idle_since = time.monotonic()
                if isinstance(got[0], str):  # the end marker
                    return
                step, experiences = got[0]
                if step > self.last:  # else a copy a resumed explorer republished
                    self.last = step
                    yield step, experiences
        finally:
            with contextlib.suppress(Exception):  # a queue already gone needs no goodbye
                ray.get(actor.leave.remote(), timeout=10)

    def _get(self, actor: Any) -> list[Any]:
        import ray  # heavy, deferred: the driver and the trainer import this module without Ray

        try:
            return get_within(actor.get.remote(self.poll_s), self.name, self.poll_s + ACTOR_CALL_S)
        except ray.exceptions.RayActorError:
            raise RuntimeError(
                f"the experience queue {self.name} went away before the end of its stream: the explorer "
                "stopped or failed. Its committed steps are in its store (operators.sinks.reader)"
            ) from None

    def _attach(self) -> Any:
        """The queue actor, waiting for the explorer to create it; None on stop or idle timeout."""
        import ray  # heavy, deferred: the driver and the trainer import this module without Ray

        since = time.monotonic()
        while not self.stop.is_set():
            try:
                return ray.get_actor(self.name, namespace=NAMESPACE)
            except ValueError:
                if self._idle(since):
                    return None
                self.stop.wait(self.poll_s)
        return None

    def _idle(self, since: float) -> bool:
        return self.idle_timeout is not None and time.monotonic() - since >= self.idle_timeout
