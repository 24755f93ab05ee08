"""The engine's side of batched calls (`ServesCallBatches`), in-process: answers as they finish, coalesced;
one request cancelled alone, even before its batch arrives; errors carried back whole. No Ray, no vLLM
(the forwarder's side, `CallBatcher`, runs on a real engine actor in
tests/integration/test_batched_engine_calls.py)."""

from __future__ import annotations

import asyncio
import threading

from operators.engine.call_batches import CANCELLED, FAILED, OK, ServesCallBatches, portable
from schemas.errors import TaskInputError


class ToyEngine(ServesCallBatches):
    """Answers `generate` once `go` is set (at once for prompt "now"); "bad" is refused as a bad input."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def generate(self, prompt: str, sampling: dict) -> dict:
        if prompt == "bad":
            raise TaskInputError("prompt 'bad' is refused")
        if prompt != "now":
            await self.go.wait()
        return {"prompt": prompt, "n": sampling.get("n", 1)}


def collect(engine: ToyEngine, calls, during=None) -> list[list[tuple]]:
    """The yields of one `serve` of `calls`; `during(engine)` runs once the first yield is in."""

    async def scenario() -> list[list[tuple]]:
        yields = []
        async for answers in engine.serve(calls):
            yields.append(answers)
            if during is not None and len(yields) == 1:
                during(engine)
        return yields

    return asyncio.run(scenario())


def test_answers_come_back_as_they_finish_and_those_finished_together_in_one_yield():
    calls = [("a", "generate", ("now", {})), *((f"k{i}", "generate", ("later", {"n": i})) for i in range(5))]
    yields = collect(ToyEngine(), calls, during=lambda engine: engine.go.set())
    assert yields[0] == [("a", OK, {"prompt": "now", "n": 1})]
    assert len(yields) == 2  # the five released together come back together
    assert sorted(yields[1]) == [(f"k{i}", OK, {"prompt": "later", "n": i}) for i in range(5)]


def test_a_failed_request_carries_its_exception_and_the_others_still_answer():
    engine = ToyEngine()
    engine.go.set()
    calls = [("bad", "generate", ("bad", {})), ("ok", "generate", ("p", {})), ("nope", "shutdown", ())]
    answers = {key: (kind, value) for batch in collect(engine, calls) for key, kind, value in batch}
    assert answers["ok"] == (OK, {"prompt": "p", "n": 1})
    kind, exc = answers["bad"]
    assert kind == FAILED and isinstance(exc, TaskInputError) and "refused" in str(exc)
    kind, exc = answers["nope"]  # only the request methods are served in batches
    assert kind == FAILED and "serves no batched 'shutdown'" in str(exc)
    assert engine.batch_counts() == {"batches": 1, "calls": 3, "sizes": [3]}


def test_one_request_is_cancelled_alone():
    calls = [
        ("now", "generate", ("now", {})),
        ("cut", "generate", ("x", {})),
        ("keep", "generate", ("y", {})),
    ]

    def cut_then_release(engine: ToyEngine) -> None:
        assert engine.cancel_calls(["cut"]) == 1
        engine.go.set()

    answers = {a[0]: a[1] for batch in collect(ToyEngine(), calls, during=cut_then_release) for a in batch}
    assert answers == {"now": OK, "cut": CANCELLED, "keep": OK}


def test_a_cancel_that_arrives_before_its_batch_still_cancels_it():
    engine = ToyEngine()
    assert engine.cancel_calls(["early"]) == 0  # not running yet: remembered
    engine.go.set()
    answers = [a for batch in collect(engine, [("early", "generate", ("x", {}))]) for a in batch]
    assert answers == [("early", CANCELLED, None)]
    assert not engine.served_calls().cancelled_early  # used once, then forgotten


def test_closing_the_stream_cancels_the_requests_still_running():
    engine = ToyEngine()

    async def scenario() -> list:
        stream = engine.serve([("now", "generate", ("now", {})), ("slow", "generate", ("x", {}))])
        await stream.__anext__()
        slow = engine.served_calls().running["slow"]
        await stream.aclose()  # the caller went away
        await asyncio.sleep(0)
        return [slow.cancelled(), dict(engine.served_calls().running)]

    assert asyncio.run(scenario()) == [True, {}]


def test_an_exception_that_cannot_be_pickled_comes_back_as_its_name_and_message():
    class Holds(Exception):
        def __init__(self, message: str):
            super().__init__(message)
            self.lock = threading.Lock()

    plain = portable(Holds("core said no"))
    assert type(plain) is RuntimeError and str(plain) == "Holds: core said no"
    refused = TaskInputError("too long")
    assert portable(refused) is refused
