"""Trajectory assembly, the recording transport's parsing, and the new experience fields through the sinks:
without an engine (the engine tests run them for real in tests/engine/test_multi_turn.py)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from operators.sinks.parquet import PENDING, read_fragments, step_dirname
from operators.sinks.sql import SqlSink
from operators.workflows.recording import Recorder, TurnLimit, call_of, prepared, sse_events
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


# -- the recording transport ---------------------------------------------------------------------------------


def test_requests_ask_for_token_ids_and_logprobs_and_keep_the_agents_seed():
    chat = prepared({"messages": [], "seed": 7}, chat=True, seed=3)
    assert chat["return_token_ids"] is True and chat["logprobs"] is True and chat["seed"] == 7
    completion = prepared({"prompt": "x"}, chat=False, seed=3)
    assert completion["logprobs"] == 0 and completion["seed"] == 3


def test_a_chat_answer_and_a_stream_of_chunks_record_the_same_call():
    whole = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {"index": 0, "token_ids": [5, 6], "finish_reason": "stop",
             "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]}},
        ],
    }  # fmt: skip
    chunks = [
        {"prompt_token_ids": [1, 2], "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "token_ids": [5], "logprobs": {"content": [{"logprob": -0.5}]}}]},
        {"choices": [{"index": 0, "token_ids": [6], "logprobs": {"content": [{"logprob": -0.25}]},
                      "finish_reason": "stop"}]},
    ]  # fmt: skip
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    expected = Call([1, 2], [5, 6], [-0.5, -0.25], 3, "stop")
    assert call_of([whole], chat=True, version=3) == expected
    assert call_of(sse_events(stream.encode()), chat=True, version=3) == expected


def test_a_completions_answer_is_recorded_from_its_choice():
    body = {"choices": [{"index": 0, "prompt_token_ids": [1], "token_ids": [4],
                         "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "length"}]}  # fmt: skip
    assert call_of([body], chat=False, version=0) == Call([1], [4], [-1.0], 0, "length")


def test_an_answer_without_ids_is_refused_not_recorded_wrong():
    with pytest.raises(ValueError, match="not a call that can be recorded"):
        call_of([{"choices": [{"index": 0, "message": {"content": "hi"}}]}], chat=True, version=0)


def test_the_recorder_refuses_a_call_past_max_turns_or_the_budget():
    recorder = Recorder(seed=None, max_turns=2, budget=100)
    recorder.calls[recorder.admit() :] = [FIRST]
    recorder.admit()
    with pytest.raises(TurnLimit) as info:
        recorder.admit()
    assert info.value.finish_reason == "max_turns"
    full = Recorder(seed=None, max_turns=5, budget=5)
    full.calls[full.admit() :] = [FIRST]  # 3 + 2 tokens: the budget is filled
    with pytest.raises(TurnLimit) as info:
        full.admit()
    assert info.value.finish_reason == "length"


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
