"""Exactly once per (task_uid, run_id), whole steps only: the sink contract on Parquet, SQLite and PostgreSQL.

The PostgreSQL cases run against the real server named by RFTFLOW_TEST_POSTGRES_URL (`.ci/run` starts one
with `.ci/postgres`); without it they are skipped.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from services import postgres_url
from sink_doubles import HalfInsertDouble
from unit.unit_factories import fragments_of, make_results

from operators.sinks.parquet import ParquetSink, write_fragments
from operators.sinks.reader import ExperienceReader
from operators.sinks.sql import SqlSink

SQL_STORES = ["sqlite", "postgresql"]
STEPS, TASKS, REPEATS = 6, 5, 3


def step_spec(step: int) -> list[tuple[str, int, int]]:
    """TASKS tasks of REPEATS experiences each, with uids unique to the step."""
    return [(f"arith/e0/{(step - 1) * TASKS + t}", step, REPEATS) for t in range(TASKS)]


@pytest.fixture(params=["parquet", *SQL_STORES])
def new_sink(request, tmp_path):
    """Opens a new sink on one store, as each explorer process (or racing committer) would."""
    root = tmp_path / "experiences"
    if request.param == "parquet":
        yield lambda cls=ParquetSink: cls(root)
        return
    url = f"sqlite:///{tmp_path / 'experiences.db'}"
    if request.param == "postgresql":
        url = postgres_url()
    name = f"t_{uuid.uuid4().hex[:12]}"  # a PostgreSQL database outlives the test: tables of its own
    opened: list[SqlSink] = []

    def new(cls=SqlSink):
        opened.append(cls(root, url, name))
        return opened[-1]

    yield new
    if opened:
        opened[0].metadata.drop_all(opened[0].engine)
        for sink in opened:
            sink.engine.dispose()


def keys(table) -> list[tuple[str, int]]:
    return list(zip(table.column("task_uid").to_pylist(), table.column("run_id").to_pylist(), strict=True))


def assert_exactly_once(sink, steps: int) -> None:
    everything = [key for _, table in ExperienceReader(sink).steps() for key in keys(table)]
    assert len(everything) == steps * TASKS * REPEATS
    assert not [key for key, n in Counter(everything).items() if n > 1]


def test_steps_commit_once_through_retried_writers_and_new_explorers(new_sink):
    for step in range(1, STEPS + 1):
        results = make_results(step_spec(step))
        records = write_fragments(results, str(new_sink().root))
        write_fragments(results, str(new_sink().root))  # a retried batch writes its step again
        assert new_sink().commit_step(step, fragments_of(records)) == 0  # each commit by a new process
        with pytest.raises(RuntimeError, match="already committed"):
            new_sink().commit_step(step, fragments_of(records))
    assert new_sink().committed_steps() == list(range(1, STEPS + 1))
    assert_exactly_once(new_sink(), STEPS)


def test_two_committers_racing_on_one_step_commit_it_once(new_sink):
    first = write_fragments(make_results(step_spec(1)), str(new_sink().root))
    new_sink().commit_step(1, fragments_of(first))  # the store exists; two explorers then race on step 2
    records = write_fragments(make_results(step_spec(2)), str(new_sink().root))
    racers = [new_sink(), new_sink()]
    start, outcomes = threading.Barrier(len(racers)), []

    def commit(sink):
        start.wait()
        try:
            outcomes.append(sink.commit_step(2, fragments_of(records)))
        except Exception as exc:  # the loser may fail at any point of its commit, but it must fail
            outcomes.append(exc)

    threads = [threading.Thread(target=commit, args=(racer,)) for racer in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == 2 and [o for o in outcomes if not isinstance(o, Exception)] == [0]
    assert new_sink().committed_steps() == [1, 2]
    assert_exactly_once(new_sink(), 2)


def test_a_following_reader_only_ever_sees_whole_steps(new_sink):
    stop, seen = threading.Event(), []
    reader = ExperienceReader(new_sink()).steps(follow=True, poll_s=0.001, stop=stop)
    thread = threading.Thread(target=lambda: seen.extend((step, len(t)) for step, t in reader))
    thread.start()
    try:
        for step in range(1, STEPS + 1):
            records = write_fragments(make_results(step_spec(step)), str(new_sink().root))
            new_sink().commit_step(step, fragments_of(records))
    finally:
        ExperienceReader(new_sink()).wait_for(STEPS, timeout=30)
        stop.set()
        thread.join(timeout=30)
    assert seen == [(step, TASKS * REPEATS) for step in range(1, STEPS + 1)]


@pytest.mark.parametrize("new_sink", SQL_STORES, indirect=True)  # Parquet commits by one rename
def test_an_insert_cut_off_halfway_leaves_no_trace(new_sink):
    records = write_fragments(make_results(step_spec(1)), str(new_sink().root))
    with pytest.raises(RuntimeError, match="double: died halfway"):
        new_sink(HalfInsertDouble).commit_step(1, fragments_of(records))
    assert new_sink().committed_steps() == [] and new_sink().read_step(1).num_rows == 0
    new_sink().commit_step(1, fragments_of(records))
    assert_exactly_once(new_sink(), 1)
