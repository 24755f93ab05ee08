"""The trainer's reader: committed steps only, in order, for both sinks; following a run sees each commit."""

from __future__ import annotations

import queue
import threading
import time
from functools import partial

import pytest
import yaml
from unit_factories import make_results, write_and_commit

from operators.sinks.base import open_sink
from operators.sinks.parquet import write_fragments
from operators.sinks.reader import ExperienceReader, open_reader
from schemas.config import Config, ExperienceBufferConfig
from schemas.errors import InputError
from schemas.run_end import clear_finished, finished_step, mark_finished

STORAGE = ["parquet", "sql"]


@pytest.fixture(params=STORAGE)
def buffer(request) -> ExperienceBufferConfig:
    return ExperienceBufferConfig(storage_type=request.param)


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "run"


class PollSpy:
    """Test double around a sink: counts the reader's polls, so a test knows the reader has looked."""

    def __init__(self, sink):
        self.sink, self.root, self.polls = sink, sink.root, queue.Queue()

    def committed_steps(self):
        steps = self.sink.committed_steps()
        self.polls.put(steps)
        return steps

    def __getattr__(self, name):
        return getattr(self.sink, name)


def uids(table) -> list[str]:
    return table.column("uid").to_pylist()


def test_steps_yields_committed_steps_in_order_and_never_a_pending_one(buffer, run_dir):
    sink = open_sink(buffer, run_dir)
    write_and_commit(sink, [("a", 1, 2), ("b", 2, 1)])
    write_fragments(make_results([("c", 3, 2)]), str(sink.root))  # step 3 is written, not committed
    reader = ExperienceReader(sink)
    assert [(step, uids(table)) for step, table in reader.steps()] == [(1, ["a/0", "a/1"]), (2, ["b/0"])]
    assert [step for step, _ in reader.steps(start=2)] == [2]
    assert reader.committed_steps() == [1, 2]
    with pytest.raises(KeyError, match="step 3 is not committed"):
        reader.read_step(3)


def test_following_sees_a_step_only_once_it_commits(buffer, run_dir):
    sink = PollSpy(open_sink(buffer, run_dir))
    write_and_commit(sink.sink, [("a", 1, 1)])
    records = write_fragments(make_results([("b", 2, 2)]), str(sink.root))
    seen: queue.Queue = queue.Queue()
    stop = threading.Event()
    follow = ExperienceReader(sink).steps(follow=True, poll_s=0.01, stop=stop)
    thread = threading.Thread(target=lambda: [seen.put((s, uids(t))) for s, t in follow])
    thread.start()
    try:
        assert seen.get(timeout=10) == (1, ["a/0"])
        for _ in range(3):  # the poll that found step 1, then two more with step 2 pending: nothing new
            assert sink.polls.get(timeout=10) == [1]
        assert seen.empty()
        fragments = {f for f in records.column("fragment").to_pylist() if f}
        sink.sink.commit_step(2, fragments)
        assert seen.get(timeout=10) == (2, ["b/0", "b/1"])
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive() and seen.empty()


def test_following_ends_after_the_idle_timeout(buffer, run_dir):
    sink = open_sink(buffer, run_dir)
    write_and_commit(sink, [("a", 1, 1)])
    reader = ExperienceReader(sink)
    assert [step for step, _ in reader.steps(follow=True, poll_s=0.01, idle_timeout=0.05)] == [1]
    assert reader.wait_for(1, timeout=0)
    assert not reader.wait_for(2, poll_s=0.01, timeout=0.05)


def test_open_reader_finds_the_store_in_the_run_config(run_dir):
    run_dir.mkdir()
    config = Config()
    config.buffer.trainer_input.experience_buffer.storage_type = "sql"
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    write_and_commit(open_sink(config.buffer.trainer_input.experience_buffer, run_dir), [("a", 1, 2)])
    reader = open_reader(run_dir)
    assert reader.sink.describe().startswith(f"sqlite:///{run_dir}/experiences.db, table run ")
    assert [(step, len(table)) for step, table in reader.steps()] == [(1, 2)]
    mark_finished(run_dir, 1)  # the explorer's mark, found in the run dir
    assert [step for step, _ in reader.steps(follow=True, poll_s=0.01, idle_timeout=600)] == [1]


def test_open_reader_without_a_run_config_says_so(run_dir):
    with pytest.raises(InputError, match=r"config.yaml: no config.yaml: not an explore run dir"):
        open_reader(run_dir)


def test_following_a_finished_run_ends_at_its_mark_not_its_idle_timeout(buffer, run_dir):
    sink = open_sink(buffer, run_dir)
    write_and_commit(sink, [("a", 1, 1), ("b", 2, 1)])
    mark_finished(run_dir, 2)
    reader = ExperienceReader(sink, partial(finished_step, run_dir))
    started = time.monotonic()
    assert [step for step, _ in reader.steps(follow=True, poll_s=0.01, idle_timeout=600)] == [1, 2]
    assert not reader.wait_for(3, poll_s=0.01, timeout=600)
    assert time.monotonic() - started < 5
    clear_finished(run_dir)  # a resume with steps left: the reader waits for them again
    assert finished_step(run_dir) is None
    assert [step for step, _ in reader.steps(follow=True, poll_s=0.01, idle_timeout=0.05)] == [1, 2]


def test_a_follower_started_before_the_end_sees_every_step_then_stops(run_dir):
    sink = open_sink(ExperienceBufferConfig(), run_dir)
    write_and_commit(sink, [("a", 1, 1)])
    seen: queue.Queue = queue.Queue()
    reader = ExperienceReader(sink, partial(finished_step, run_dir))
    follow = reader.steps(follow=True, poll_s=0.01, idle_timeout=600)
    thread = threading.Thread(target=lambda: [seen.put(s) for s, _ in follow])
    thread.start()
    assert seen.get(timeout=10) == 1
    write_and_commit(sink, [("b", 2, 1)])
    mark_finished(run_dir, 2)
    thread.join(timeout=10)
    assert not thread.is_alive() and seen.get(timeout=1) == 2 and seen.empty()
