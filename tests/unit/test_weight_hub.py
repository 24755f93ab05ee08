"""The weight hub as a plain class: announcements, trainer status, the broadcast rendezvous, without Ray."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from operators.actors.hub import WeightHub

SHORT = 0.05  # a wait that is meant to time out
LONG = 30.0  # a wait that is meant to end early; tests assert it did


def payload(version: int) -> dict[str, Any]:
    return {"kind": "broadcast", "meta": [("w", [2], "float32")], "tag": version}


def run(scenario):
    """Run one scenario on a fresh event loop (the hub's Condition binds to the loop that first uses it)."""
    return asyncio.run(scenario())


# -- announcements -----------------------------------------------------------------------------------------


def test_wait_newer_returns_the_newest_announcement_above_a_version() -> None:
    async def scenario():
        hub = WeightHub()
        await hub.publish(1, payload(1))
        await hub.publish(3, payload(3))
        return await hub.wait_newer(0, SHORT), await hub.wait_newer(2, SHORT)

    assert run(scenario) == ((3, payload(3)), (3, payload(3)))


def test_wait_newer_times_out_when_nothing_newer_comes() -> None:
    async def scenario():
        hub = WeightHub()
        await hub.publish(2, payload(2))
        started = time.monotonic()
        found = await hub.wait_newer(2, SHORT)
        return found, time.monotonic() - started, await hub.wait_newer(5, SHORT)

    found, waited, above_all = run(scenario)
    assert found is None and above_all is None
    assert waited >= SHORT * 0.9


def test_wait_newer_wakes_on_a_later_publish() -> None:
    async def scenario():
        hub = WeightHub()
        waiting = asyncio.ensure_future(hub.wait_newer(0, LONG))
        await asyncio.sleep(0)
        assert not waiting.done()
        await hub.publish(1, payload(1))
        return await asyncio.wait_for(waiting, 5)

    assert run(scenario) == (1, payload(1))


def test_wait_newer_returns_none_at_once_when_the_trainer_has_stopped() -> None:
    async def scenario():
        hub = WeightHub()
        await hub.set_status("stopped")
        started = time.monotonic()
        found = await hub.wait_newer(0, LONG)
        return found, time.monotonic() - started

    found, waited = run(scenario)
    assert found is None
    assert waited < 5  # liveness: nowhere near LONG


def test_a_trainer_stopping_wakes_a_waiting_explorer() -> None:
    async def scenario():
        hub = WeightHub()
        await hub.publish(1, payload(1))
        waiting = asyncio.ensure_future(hub.wait_newer(1, LONG))
        await asyncio.sleep(0)
        await hub.set_status("stopped")
        return await asyncio.wait_for(waiting, 5)

    assert run(scenario) is None


def test_a_stopped_trainers_last_version_is_still_handed_out() -> None:
    async def scenario():
        hub = WeightHub()
        await hub.publish(4, payload(4))
        await hub.set_status("stopped")
        return await hub.wait_newer(3, LONG)

    assert run(scenario) == (4, payload(4))


@pytest.mark.parametrize("version", [2, 1, 0, -1])
def test_publish_refuses_a_version_that_is_not_newer(version: int) -> None:
    async def scenario():
        hub = WeightHub()
        await hub.publish(2, payload(2))
        with pytest.raises(ValueError, match="not newer"):
            await hub.publish(version, payload(version))
        return hub.latest_version(), hub.payload

    assert run(scenario) == (2, payload(2))


def test_publish_refuses_version_zero_on_a_fresh_hub() -> None:
    async def scenario():
        hub = WeightHub()
        with pytest.raises(ValueError, match="not newer"):
            await hub.publish(0, payload(0))
        return hub.latest_version()

    assert run(scenario) == 0


# -- trainer status ----------------------------------------------------------------------------------------


def test_status_follows_publish_and_set_status() -> None:
    async def scenario():
        hub = WeightHub()
        seen = [hub.get_status()]
        await hub.publish(1, payload(1))
        seen.append(hub.get_status())
        await hub.set_status("running")
        seen.append(hub.get_status())
        await hub.publish(2, payload(2))
        seen.append(hub.get_status())
        await hub.set_status("stopped")
        seen.append(hub.get_status())
        return seen, hub.latest_version()

    seen, latest = run(scenario)
    assert seen == [
        {"state": "unknown", "version": 0},
        {"state": "require_sync", "version": 1},
        {"state": "running", "version": 1},
        {"state": "require_sync", "version": 2},
        {"state": "stopped", "version": 2},
    ]
    assert latest == 2


@pytest.mark.parametrize("state", ["paused", "unknown", "", "STOPPED"])
def test_set_status_refuses_unknown_states(state: str) -> None:
    async def scenario():
        hub = WeightHub()
        await hub.set_status("running")
        with pytest.raises(ValueError, match="trainer state must be one of"):
            await hub.set_status(state)
        return hub.get_status()

    assert run(scenario) == {"state": "running", "version": 0}


# -- broadcast rendezvous ----------------------------------------------------------------------------------


def test_wait_offer_times_out_then_returns_the_offer() -> None:
    async def scenario():
        hub = WeightHub()
        before = await hub.wait_offer(SHORT)
        await hub.offer_group("10.0.0.1", 29500)
        return before, await hub.wait_offer(SHORT)

    assert run(scenario) == (None, {"master_address": "10.0.0.1", "master_port": 29500})


def test_wait_offer_wakes_on_the_offer() -> None:
    async def scenario():
        hub = WeightHub()
        waiting = asyncio.ensure_future(hub.wait_offer(LONG))
        await asyncio.sleep(0)
        assert not waiting.done()
        await hub.offer_group("127.0.0.1", 40001)
        return await asyncio.wait_for(waiting, 5)

    assert run(scenario) == {"master_address": "127.0.0.1", "master_port": 40001}


def test_wait_workers_times_out_then_returns_the_count() -> None:
    async def scenario():
        hub = WeightHub()
        before = await hub.wait_workers(SHORT)
        await hub.set_workers(4)
        return before, await hub.wait_workers(SHORT)

    assert run(scenario) == (None, 4)


def test_wait_workers_wakes_on_the_count_and_zero_counts() -> None:
    async def scenario():
        hub = WeightHub()
        waiting = asyncio.ensure_future(hub.wait_workers(LONG))
        await asyncio.sleep(0)
        assert not waiting.done()
        await hub.set_workers(0)
        return await asyncio.wait_for(waiting, 5)

    assert run(scenario) == 0
