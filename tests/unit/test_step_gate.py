"""The step gate and the period boundaries it is released to, without Ray."""

import asyncio
import time

import pyarrow as pa
import pytest

from operators.actors.gate import GateClient, StepGate
from pipelines.control.sync_policy import release_boundary


def test_tasks_of_a_step_wait_until_it_is_released():
    async def scenario() -> list[str]:
        gate, order = StepGate(released=2), []

        async def task(step: int) -> None:
            await GateClient(gate).admit(step)
            order.append(f"step {step} ran")

        waiting = asyncio.ensure_future(task(3))
        await task(2)  # inside the released period: no wait
        await asyncio.sleep(0)
        assert not waiting.done()
        order.append("sync")
        await gate.release(3)
        await waiting
        return order

    assert asyncio.run(scenario()) == ["step 2 ran", "sync", "step 3 ran"]


def test_release_never_goes_back():
    async def scenario() -> int:
        gate = StepGate()
        await gate.release(5)
        return await gate.release(3)

    assert asyncio.run(scenario()) == 5


@pytest.mark.parametrize(
    "method,style,latest,interval,offset,expected",
    [
        ("none", "fixed", 0, 1, 0, 10),  # no weight source: everything runs
        ("checkpoint", "fixed", 0, 1, 0, 1),  # sync after every step: one step at a time
        ("checkpoint", "fixed", 0, 3, 0, 3),  # a period of 3 steps overlaps freely
        ("checkpoint", "fixed", 3, 3, 0, 6),
        ("checkpoint", "fixed", 0, 2, 1, 3),  # first sync once past the offset: (3 - 1) % 2 == 0
        ("checkpoint", "fixed", 3, 2, 1, 5),
        ("checkpoint", "fixed", 8, 4, 0, 10),  # capped at the last step
        ("checkpoint", "dynamic_by_explorer", 2, 3, 0, 5),
        ("checkpoint", "dynamic_by_trainer", 0, 1, 0, 10),
    ],
)
def test_release_boundary(method, style, latest, interval, offset, expected):
    got = release_boundary(method, style, latest_step=latest, num_steps=10, interval=interval, offset=offset)
    assert got == expected


@pytest.mark.parametrize(
    "method,style,latest,interval,offset,max_staleness,expected",
    [
        ("checkpoint", "dynamic_by_trainer", 0, 1, 0, 1, 2),  # nothing more than 2 steps ahead starts
        ("checkpoint", "dynamic_by_trainer", 4, 1, 1, 0, 6),  # the offset widens the window
        ("checkpoint", "fixed", 0, 5, 0, 1, 2),  # a long period is cut by the window
        ("checkpoint", "fixed", 0, 1, 0, 3, 1),  # the period is tighter than the window
        ("checkpoint", "dynamic_by_trainer", 9, 1, 0, 2, 10),  # capped at the last step
        ("none", "fixed", 0, 1, 0, 0, 10),  # no weight source: no version can go stale
    ],
)
def test_admission_by_staleness_caps_the_release(
    method, style, latest, interval, offset, max_staleness, expected
):
    got = release_boundary(
        method, style, latest_step=latest, num_steps=10, interval=interval, offset=offset,
        max_staleness=max_staleness,
    )  # fmt: skip
    assert got == expected


@pytest.mark.parametrize(
    "style,latest,interval,offset,max_staleness,expected",
    [
        ("fixed", 0, 1, 0, None, 2),  # the step after the next sync starts before it, to be cut by it
        ("fixed", 0, 1, 1, None, 3),  # no sync after step 1 (offset): steps 1-2, then step 3
        ("fixed", 0, 3, 0, None, 6),  # one whole period more
        ("dynamic_by_explorer", 2, 3, 0, None, 8),
        ("fixed", 0, 1, 0, 0, 1),  # admission by staleness still caps it
        ("fixed", 4, 1, 0, 1, 6),  # a continuation from version 4 commits at most 1 behind version 5
        ("fixed", 4, 1, 1, 1, 5),  # the offset has used the bound up: no extra step
        ("fixed", 4, 1, 1, 2, 6),
        ("fixed", 8, 3, 0, None, 10),
    ],
)
def test_partial_rollout_releases_one_period_past_the_next_sync(
    style, latest, interval, offset, max_staleness, expected
):
    got = release_boundary(
        "checkpoint", style, latest_step=latest, num_steps=10, interval=interval, offset=offset,
        max_staleness=max_staleness, partial=True,
    )  # fmt: skip
    assert got == expected


def test_collect_hands_each_report_out_once():
    first, second = pa.table({"step": [1]}), pa.table({"step": [2, 2]})

    async def scenario() -> tuple[list[pa.Table], list[pa.Table]]:
        gate = StepGate()
        await gate.report(first)
        await GateClient(gate).report(second)
        return await gate.collect(timeout=1.0), await gate.collect(timeout=0.05)

    collected, again = asyncio.run(scenario())
    assert [t.equals(want) for t, want in zip(collected, [first, second], strict=True)] == [True, True]
    assert again == []


def test_collect_with_nothing_reported_returns_nothing_after_the_timeout():
    async def scenario() -> tuple[list[pa.Table], float]:
        gate = StepGate()
        started = time.monotonic()
        return await gate.collect(timeout=0.05), time.monotonic() - started

    collected, waited = asyncio.run(scenario())
    assert collected == []
    assert 0.04 <= waited < 5


def test_collect_wakes_on_the_first_report():
    records = pa.table({"step": [3]})

    async def scenario() -> list[pa.Table]:
        gate = StepGate()
        waiting = asyncio.ensure_future(gate.collect(timeout=30))
        await asyncio.sleep(0)
        assert not waiting.done()
        await gate.report(records)
        return await asyncio.wait_for(waiting, 5)

    collected = asyncio.run(scenario())
    assert len(collected) == 1 and collected[0].equals(records)
