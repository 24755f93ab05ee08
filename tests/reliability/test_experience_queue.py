"""The experience queue on a real local Ray: bounded, nothing lost, nothing twice, no actor left behind."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import ray
from integration_settings import BASE
from unit.unit_factories import make_experience, write_and_commit

from operators.actors.names import NAMESPACE
from operators.sinks.parquet import ParquetSink
from operators.sinks.queue import QueueFeed, QueueReader, queue_name
from pipelines.control.runtime import init_ray
from schemas.config import load_config
from schemas.experience import experiences_to_table

STORE = "the test store"


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    init_ray(load_config(None, BASE).ray)  # the session's cluster when the stack tests started one


@pytest.fixture
def run_name():
    return f"queue-test-{uuid.uuid4().hex[:8]}"


def table(step: int):
    return experiences_to_table([make_experience(f"t/e0/{step}", 0, step=step)])


def queue_exists(run_name: str) -> bool:
    try:
        ray.get_actor(queue_name(run_name), namespace=NAMESPACE)
    except ValueError:
        return False
    return True


class Consumer:
    """A trainer stand-in: reads the queue in a thread, or one step at a time when asked to."""

    def __init__(self, run_name: str, **options):
        self.reader = QueueReader(run_name, poll_s=0.05, **options)
        self.steps: list[int] = []
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self):
        try:
            for step, experiences in self.reader:
                assert experiences.equals(table(step))
                self.steps.append(step)
        except Exception as exc:
            self.error = exc

    def join(self) -> Consumer:
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        return self


def test_a_full_queue_holds_the_explorer_back_until_the_trainer_reads(run_name):
    feed = QueueFeed(run_name, capacity=1, timeout=60, store=STORE)
    feed.publish(1, table(1))
    blocked = threading.Thread(target=feed.publish, args=(2, table(2)))
    blocked.start()
    blocked.join(timeout=1)
    assert blocked.is_alive() and ray.get(feed.actor.size.remote()) == 1  # step 2 waits for room
    consumer = Consumer(run_name)
    blocked.join(timeout=60)
    assert not blocked.is_alive()
    assert feed.close(drain=True) == 0  # the reader took everything, then the end marker
    assert consumer.join().steps == [1, 2] and consumer.error is None
    assert not queue_exists(run_name)


def test_a_step_that_finds_no_room_fails_with_the_step_safe_in_the_store(run_name):
    feed = QueueFeed(run_name, capacity=1, timeout=0.2, store=STORE)
    feed.publish(1, table(1))
    with pytest.raises(RuntimeError) as info:
        feed.publish(2, table(2))
    assert str(info.value).startswith(
        f"step 2 is committed in {STORE}, but the experience queue {run_name}/experience_queue stayed full "
        "for 0.2 s: is a trainer reading it?"
    )
    assert feed.close(drain=True) == 1  # no reader came: the queue goes all the same, with one step untaken
    assert not queue_exists(run_name)


def test_a_resumed_explorer_republishes_and_the_reader_keeps_each_step_once(run_name, tmp_path):
    consumer = Consumer(run_name)
    feed = QueueFeed(run_name, capacity=2, timeout=60, store=STORE)
    feed.publish(1, table(1))
    feed.publish(2, table(2))  # ... and the explorer died before it could record that step 2 went out
    sink = ParquetSink(tmp_path / "experiences")
    for step in (1, 2, 3):
        write_and_commit(sink, [(f"t/e0/{step}", step, 1)])
    resumed = QueueFeed(run_name, capacity=2, timeout=60, store=STORE)  # the same queue, found by name
    assert resumed.catch_up(sink, published=1) == 3  # steps 2 (again) and 3
    assert resumed.close(drain=True) == 0
    assert consumer.join().steps == [1, 2, 3] and consumer.error is None
    assert not queue_exists(run_name)


def test_a_failed_run_removes_its_queue_and_the_reader_is_told(run_name):
    feed = QueueFeed(run_name, capacity=2, timeout=60, store=STORE)
    consumer = Consumer(run_name)
    feed.publish(1, table(1))
    deadline = time.monotonic() + 60
    while consumer.steps != [1] and time.monotonic() < deadline:  # the reader took step 1 ...
        time.sleep(0.01)
    assert consumer.steps == [1]
    assert (
        feed.close(drain=False) == 0
    )  # ... so no step is left untaken, and the close does not wait for more
    consumer.join()
    assert "went away before the end of its stream" in str(consumer.error)
    assert not queue_exists(run_name)


def test_a_reader_gives_up_on_a_queue_that_never_comes(run_name):
    assert list(QueueReader(run_name, poll_s=0.01, idle_timeout=0.1)) == []
    stop = threading.Event()
    stop.set()
    assert list(QueueReader(run_name, stop=stop)) == []
