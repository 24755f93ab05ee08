"""Trajectory assembly and the new experience fields through the sinks:
without an engine (the engine tests run them for real in tests/engine/test_multi_turn.py)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from operators.sinks.parquet import PENDING, read_fragments, step_dirname
from operators.sinks.sql import SqlSink
from operators.workflows.trajectory import Call, assemble, segment_experiences
from pipelines.control.metrics import experience_metrics
from schemas.experience import EXPERIENCE_SCHEMA, experiences_to_table
from schemas.task import Task

FIRST = Call([1, 2, 3], [10, 11], [-0.1, -0.2], 4, "stop")
SECOND = Call([1, 2, 3, 10, 11, 50, 51], [12], [-0.3], 5, "length")  # inserted 50, 51
EDITED = Call([1, 2, 3, 99], [13, 14], [-0.4, -0.5], 5, "stop")  # does not extend: a split


def test_calls_that_extend_each_other_merge_into_one_segment():
    [segment] = assemble([FIRST, SECOND])
    assert segment.prompt_ids == [1, 2, 3]
    assert segment.response_ids == [10, 11, 50, 51, 12]
    assert segment.action_mask == [True, True, False, False, True]
    assert segment.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert segment.token_versions == [4, 4, -1, -1, 5]
    assert segment.inserted_spans == [(2, 4)] and segment.turns == 2
    assert segment.model_version == 4 and segment.finish_reason == "length"  # the oldest sampled version


def test_a_prompt_that_does_not_extend_starts_a_new_segment():
    segments = assemble([FIRST, SECOND, EDITED])
    assert [s.prompt_ids for s in segments] == [[1, 2, 3], [1, 2, 3, 99]]
    assert [s.split for s in segments] == [False, True]
    assert segments[1].response_ids == [13, 14] and all(segments[1].action_mask)


def test_per_call_mode_keeps_every_call_whole_and_counts_no_split():
    segments = assemble([FIRST, SECOND], mode="per_call")
    assert [(s.prompt_ids, s.response_ids) for s in segments] == [
        (FIRST.prompt_ids, FIRST.response_ids),
        (SECOND.prompt_ids, SECOND.response_ids),
    ]
    assert not any(s.split for s in segments)


def make_task() -> Task:
    return Task(
        "t/e0/0", taskset="t", epoch=0, index=0, step=2, prompt="p", truth="", workflow="w", reward_fn=""
    )


def test_segments_become_experiences_keyed_by_segment_with_the_runs_reward():
    segments = assemble([FIRST, SECOND, EDITED])
    texts = [("p0", "r0"), ("p1", "r1")]
    experiences = segment_experiences(make_task(), 3, segments, texts, 1.5, {"accuracy": 1.0})
    assert [e.uid for e in experiences] == ["t/e0/0/3", "t/e0/0/3/s1"]
    assert [(e.segment, e.reward, e.model_version) for e in experiences] == [(0, 1.5, 4), (1, 1.5, 5)]
    for experience in experiences:
        experience.validate()
    table = experiences_to_table(experiences)
    assert table.column("inserted_spans").to_pylist() == [[[2, 4]], []]
    metrics = experience_metrics(table)
    assert metrics["rollout/trajectory_splits"] == 1.0 and metrics["rollout/turns/max"] == 2


# -- sinks: the new fields, and run dirs written before them -------------------------------------------------


def old_table() -> pa.Table:
    """An experience table as rftflow wrote it before segments."""
    experience = segment_experiences(make_task(), 0, assemble([FIRST]), [("p", "r")], 1.0, {})[0]
    table = experiences_to_table([experience])
    return table.drop_columns(["segment", "turns", "token_versions", "inserted_spans"])


def test_an_old_parquet_fragment_reads_as_segment_0_sampled_at_its_version(tmp_path):
    pq.write_table(old_table(), tmp_path / "part.parquet")
    table = read_fragments([tmp_path / "part.parquet"])
    assert table.schema == EXPERIENCE_SCHEMA
    row = table.to_pylist()[0]
    assert (row["segment"], row["turns"], row["inserted_spans"]) == (0, 1, [])
    assert row["token_versions"] == [row["model_version"]] * len(row["response_ids"])


def test_the_sql_sink_round_trips_the_new_fields_and_reads_an_older_table(tmp_path):
    segments = assemble([FIRST, SECOND, EDITED])
    table = experiences_to_table(
        segment_experiences(make_task(), 0, segments, [("a", "b"), ("c", "d")], 1.0, {})
    )
    root, url = tmp_path / "staging", f"sqlite:///{tmp_path / 'db.sqlite'}"
    pending = root / PENDING / step_dirname(2)  # the task's step
    pending.mkdir(parents=True)
    pq.write_table(table, pending / "part-a.parquet")
    sink = SqlSink(root, url, "exps")
    try:
        sink.commit_step(2, {"part-a.parquet"})
        assert sink.read_step(2).equals(table)
    finally:
        sink.close()
    engine = sa.create_engine(url)
    added = ("segment", "turns", "token_versions", "inserted_spans")
    kept = ", ".join(c for c in [*EXPERIENCE_SCHEMA.names, "position"] if c not in added)
    with engine.begin() as conn:  # as a table written before segments: no such columns
        conn.execute(sa.text(f"CREATE TABLE older AS SELECT {kept} FROM exps"))
        conn.execute(sa.text("DROP TABLE exps"))
        conn.execute(sa.text("ALTER TABLE older RENAME TO exps"))
    engine.dispose()
    older = SqlSink(root, url, "exps")
    try:
        rows = older.read_step(2).to_pylist()
        assert [(r["segment"], r["turns"], r["inserted_spans"]) for r in rows] == [(0, 1, [])] * 2
    finally:
        older.close()
