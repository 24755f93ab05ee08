"""Engine requests travel in batches: one Ray call carries every request a forwarder makes in one turn of its
event loop, and one stream brings their answers back as they finish.

A Ray actor call costs about 0.5 ms of CPU at each end on a busy 2-core machine, as much as vLLM spends on a
short request, and a rollout makes one request per task. The calls of a batch's tasks are started together, so
they are sent together (`CallBatcher`, in the forwarder); the engine (`ServesCallBatches`) runs them
concurrently and yields, each time one finishes, every answer finished by then (a yield per answer would cost
as much as a call per request). A request is still cancelled on its own (a timeout, an over-rollout cut): the
caller's cancellation sends its key to `cancel_calls`, and the engine cancels that request's task alone.
"""

from __future__ import annotations

import asyncio
import pickle
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

OK, FAILED, CANCELLED = "ok", "failed", "cancelled"
# How many cancelled keys are remembered before their batch arrives (Ray may start calls out of order).
EARLY_CANCELS = 4096
RECENT_BATCHES = 64  # how many of the latest batch sizes `batch_counts` reports

Call = tuple[str, str, tuple]  # (key, method, args)
Answer = tuple[str, str, Any]  # (key, OK | FAILED | CANCELLED, result or exception)


@dataclass
class ServedCalls:
    """An engine's side of the batches: requests running by key, keys cancelled before their batch arrived
    (Ray may start two calls from one caller out of order), and counts of batches and requests served."""

    running: dict[str, asyncio.Future] = field(default_factory=dict)
    cancelled_early: OrderedDict[str, None] = field(default_factory=OrderedDict)
    batches: int = 0
    calls: int = 0
    sizes: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))  # the latest batches


class ServesCallBatches:
    """Mixin for an engine actor class: serves `CallBatcher`'s batches of its request methods."""

    batched_methods: ClassVar[frozenset[str]] = frozenset({"chat", "generate", "chat_turn"})

    def served_calls(self) -> ServedCalls:
        """Made on first use, so an engine class needs no extra `__init__` step."""
        return self.__dict__.setdefault("served", ServedCalls())

    def batch_counts(self) -> dict[str, Any]:
        """Batches served and the requests they carried, so far, and the sizes of the latest batches: how
        well a forwarder's calls coalesce."""
        served = self.served_calls()
        return {"batches": served.batches, "calls": served.calls, "sizes": list(served.sizes)}

    async def serve(self, calls: list[Call]) -> AsyncIterator[list[Answer]]:
        """Run `calls` concurrently; yield, as they finish, the answers finished by then. Called with
        `num_returns="streaming"`. Should the stream close early, the requests still running are cancelled."""
        served = self.served_calls()
        served.batches, served.calls = served.batches + 1, served.calls + len(calls)
        served.sizes.append(len(calls))
        keys: dict[asyncio.Future, str] = {}
        for key, method, args in calls:
            if method not in self.batched_methods:
                task = failed_future(AttributeError(f"{type(self).__name__} serves no batched '{method}'"))
            else:
                task = served.running[key] = asyncio.ensure_future(getattr(self, method)(*args))
            if key in served.cancelled_early:  # its cancel came first
                del served.cancelled_early[key]
                task.cancel()
            keys[task] = key
        pending = set(keys)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                yield [answer(keys[task], task) for task in done]
        finally:
            for task in pending:
                task.cancel()
            for key in keys.values():
                served.running.pop(key, None)

    def cancel_calls(self, keys: list[str]) -> int:
        """Cancel the batched requests under `keys` (the engine aborts them); returns how many were running.
        A key not seen yet is remembered, in case its batch is started after this call."""
        served = self.served_calls()
        found = 0
        for key in keys:
            task = served.running.get(key)
            if task is not None:
                found += task.cancel()
            else:
                served.cancelled_early[key] = None
                while len(served.cancelled_early) > EARLY_CANCELS:
                    served.cancelled_early.popitem(last=False)
        return found


def failed_future(exc: BaseException) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future


def answer(key: str, task: asyncio.Future) -> Answer:
    if task.cancelled():
        return key, CANCELLED, None
    exc = task.exception()
    return (key, OK, task.result()) if exc is None else (key, FAILED, portable(exc))


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling (its type is what the caller acts on: EngineGone, StaleRequest, a bad
    input), else a RuntimeError that keeps its type's name and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class CallBatcher:
    """The forwarder's side, for one engine actor handle: requests made in the same turn of the event loop
    go in one `serve` call; each caller awaits its own answer, and its cancellation cancels only its
    request. When the engine actor dies, every request waiting on it fails with Ray's error, which
    `EngineClient` answers by sending it again to the replacement."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.queued: list[Call] = []
        self.waiting: dict[str, asyncio.Future] = {}
        self.cancels: list[str] = []
        self.streams: set[asyncio.Task] = set()  # readers held, so none is collected while it runs

    async def call(self, method: str, args: tuple) -> Any:
        loop = asyncio.get_running_loop()
        key = uuid.uuid4().hex
        future = self.waiting[key] = loop.create_future()
        if not self.queued:
            loop.call_soon(self.send)
        self.queued.append((key, method, args))
        try:
            return await future
        except asyncio.CancelledError:
            self.withdraw(key, loop)
            raise
        finally:
            self.waiting.pop(key, None)

    def withdraw(self, key: str, loop: asyncio.AbstractEventLoop) -> None:
        """A cancelled caller's request: dropped if not sent yet, else cancelled on the engine."""
        queued = [call for call in self.queued if call[0] != key]
        if len(queued) < len(self.queued):
            self.queued[:] = queued
            return
        if not self.cancels:
            loop.call_soon(self.send_cancels)
        self.cancels.append(key)

    def send(self) -> None:
        calls, self.queued = self.queued, []
        if not calls:
            return
        stream = self.engine.serve.options(num_returns="streaming").remote(calls)
        reader = asyncio.ensure_future(self.read(stream, [key for key, _, _ in calls]))
        self.streams.add(reader)
        reader.add_done_callback(self.streams.discard)

    def send_cancels(self) -> None:
        keys, self.cancels = self.cancels, []
        if keys:
            self.engine.cancel_calls.remote(keys)  # not awaited: the caller has already moved on

    async def read(self, stream: Any, keys: list[str]) -> None:
        try:
            async for ref in stream:
                for key, kind, value in await ref:
                    self.settle(key, kind, value)
        except Exception as exc:  # the engine actor died or is unreachable: no answer will come
            for key in keys:
                self.settle(key, FAILED, exc)
        else:
            for key in keys:
                self.settle(key, FAILED, RuntimeError(f"engine stream ended without an answer for {key}"))

    def settle(self, key: str, kind: str, value: Any) -> None:
        future = self.waiting.get(key)
        if future is None or future.done():
            return
        if kind == OK:
            future.set_result(value)
        elif kind == FAILED:
            future.set_exception(value)
        else:
            future.set_exception(RuntimeError(f"the engine cancelled request {key}"))
