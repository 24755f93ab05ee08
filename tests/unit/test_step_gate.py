"""The step gate and the period boundaries it is released to, without Ray."""

import asyncio

import pytest

from operators.step_gate import GateClient, StepGate
from pipelines.sync_policy import release_boundary


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
