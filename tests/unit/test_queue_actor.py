"""The experience queue actor's logic, without Ray: bounded, timed puts and gets, and the reader's goodbye."""

from __future__ import annotations

import asyncio

from operators.sinks.queue import END, ExperienceQueue, queue_name


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_full_queue_refuses_a_put_after_the_timeout():
    async def scenario():
        q = ExperienceQueue(capacity=2)
        assert await q.put((1, "t1"), 1) and await q.put((2, "t2"), 1)
        assert not await q.put((3, "t3"), 0.01)  # full: the step waits, then the put gives up
        assert q.size() == 2
        assert await q.get(1) == [(1, "t1")]
        assert await q.put((3, "t3"), 0.01)  # room again
        return [await q.get(1), await q.get(1), await q.get(0.01)]

    assert run(scenario()) == [[(2, "t2")], [(3, "t3")], []]


def test_a_blocked_put_goes_through_once_a_reader_takes_a_step():
    async def scenario():
        q = ExperienceQueue(capacity=1)
        await q.put((1, "t1"), 1)
        blocked = asyncio.create_task(q.put((2, "t2"), 10))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        assert await q.get(1) == [(1, "t1")]
        assert await blocked
        return q.size()

    assert run(scenario()) == 1


def test_the_end_marker_is_no_step_and_the_reader_says_goodbye():
    async def scenario():
        q = ExperienceQueue(capacity=2)
        await q.put((1, "t1"), 1)
        await q.put(END, 1)
        assert q.size() == 1
        assert not await q.wait_reader(0.01)
        assert await q.get(1) == [(1, "t1")] and await q.get(1) == [END]
        q.leave()
        return q.size(), await q.wait_reader(0.01)

    assert run(scenario()) == (0, True)


def test_queue_names_follow_the_run():
    assert queue_name("explore-1") == "explore-1/experience_queue"
