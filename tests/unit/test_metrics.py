"""Step metrics on hand-made tables: rewards, lengths, throughput, failures; the MLflow samples table."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from unit_factories import make_experience, make_results

from operators.rollout.over_rollout import SKIPPED
from pipelines.control.metrics import SAMPLE_COLUMNS, failure_table, rollout_tail, sample_table, step_metrics
from schemas.errors import STALE
from schemas.experience import EXPERIENCE_SCHEMA, experiences_to_table


@pytest.fixture
def experiences():
    """Three rollouts: rewards 0, 0.5, 1; response lengths 2, 4, 6 (12 tokens); model versions 1, 1, 4."""
    return experiences_to_table(
        [
            make_experience("a", 0, reward=0.0, n_tokens=2, model_version=1),
            make_experience("a", 1, reward=0.5, n_tokens=4, model_version=1),
            make_experience("b", 0, reward=1.0, n_tokens=6, model_version=4, response_text="last"),
        ]
    )


@pytest.fixture
def records():
    """Task records of the step: two ok tasks and one failed, each run for 0.25 s, ending at 1, 2 and 3 s: a
    sampling window of 0.75 to 3 s."""
    table = make_results([("a", 1, 2), ("b", 1, 1), ("c", 1, 0)])
    table = table.set_column(
        table.schema.get_field_index("finished_at"), "finished_at", pa.array([1.0, 2.0, 3.0])
    )
    return table.select(["task_uid", "step", "ok", "message", "task_run_time", "finished_at"])


def test_step_metrics_values(experiences, records):
    metrics = step_metrics(experiences, records, seconds=4.0, reference_version=4, dropped_stale=2)
    assert metrics == pytest.approx(
        {
            "rollout/reward/mean": 0.5,
            "rollout/reward/max": 1.0,
            "rollout/reward/min": 0.0,
            "rollout/response_length/mean": 4.0,
            "rollout/response_length/max": 6,
            "rollout/response_length/min": 2,
            "rollout/tokens_per_s": 12 / 2.25,  # over the step's own sampling window, not time/step
            "rollout/failed_tasks": 1.0,
            "pipeline/experience_count": 3.0,
            "time/step": 4.0,
            "time/sampling": 2.25,
            "rollout/model_version": 2.0,
            "rollout/turns/mean": 1.0,
            "rollout/turns/max": 1,
            "rollout/turns/min": 1,
            "rollout/trajectory_splits": 0.0,
            "rollout/staleness/mean": 2.0,
            "rollout/staleness/max": 3,
            "rollout/staleness/min": 0,
            "rollout/stale_dropped": 2.0,
            "rollout/skipped_tasks": 0.0,
            "rollout/recycled_tasks": 0.0,
            "rollout/stale_cancelled": 0.0,
            "time/rollout_tail": 0.0,  # of 3 sub-runs, the last 10% is the last one alone
            # each reward part the workflow recorded (here every experience's accuracy is 1)
            "rollout/accuracy/mean": 1.0,
            "rollout/accuracy/max": 1.0,
            "rollout/accuracy/min": 1.0,
        }
    )


def with_messages(records: pa.Table, messages: list[str | None]) -> pa.Table:
    ok = [m is None for m in messages]
    records = records.set_column(records.schema.get_field_index("ok"), "ok", pa.array(ok))
    return records.set_column(records.schema.get_field_index("message"), "message", pa.array(messages))


def test_sub_runs_ended_on_purpose_are_counted_apart_from_failures(experiences):
    records = make_results([("a", 1, 2), ("b", 1, 1), ("c", 1, 0)])
    messages = [f"{SKIPPED} (ratio 0.25)", f"{STALE} attempt 1: StaleRequest: sampled on version 0", "boom"]
    metrics = step_metrics(experiences, with_messages(records, messages), seconds=1.0)
    assert metrics["rollout/skipped_tasks"] == 1.0
    assert metrics["rollout/stale_cancelled"] == 1.0
    assert metrics["rollout/failed_tasks"] == 1.0
    assert failure_table(with_messages(records, messages))["message"] == ["boom"]


def test_rollout_tail_is_the_time_the_last_tenth_of_sub_runs_took():
    ends = pa.table({"finished_at": [100.0 + i for i in range(9)] + [130.0]})
    assert rollout_tail(ends) == pytest.approx(22.0)  # from the 9th of 10 (at 108) to the last (at 130)
    assert rollout_tail(ends.slice(0, 1)) == 0.0


def test_an_empty_sampling_window_gives_zero_throughput(experiences, records):
    index = records.schema.get_field_index
    instant = records.set_column(index("task_run_time"), "task_run_time", [[0.0] * 3])
    instant = instant.set_column(index("finished_at"), "finished_at", [[5.0] * 3])
    assert step_metrics(experiences, instant, seconds=1.0)["rollout/tokens_per_s"] == 0.0


def test_metrics_of_a_step_where_every_task_failed(records):
    failed = records.filter(pc.equal(records["task_uid"], "c"))
    metrics = step_metrics(EXPERIENCE_SCHEMA.empty_table(), failed, 2.0)
    assert metrics == {
        "rollout/tokens_per_s": 0.0,
        "rollout/failed_tasks": 1.0,
        "rollout/stale_dropped": 0.0,
        "rollout/skipped_tasks": 0.0,
        "rollout/recycled_tasks": 0.0,
        "rollout/stale_cancelled": 0.0,
        "pipeline/experience_count": 0.0,
        "time/step": 2.0,
        "time/sampling": 0.25,
        "time/rollout_tail": 0.0,
    }


@pytest.mark.parametrize(("limit", "expected"), [(2, 2), (3, 3), (10, 3), (0, 0)])
def test_sample_table_limit(experiences, limit, expected):
    sample = sample_table(experiences, limit)
    assert tuple(sample) == SAMPLE_COLUMNS
    assert all(len(values) == expected for values in sample.values())
    assert sample["uid"] == ["a/0", "a/1", "b/0"][:expected]


def test_sample_table_keeps_texts_and_rewards(experiences):
    sample = sample_table(experiences, 3)
    assert sample["response_text"][-1] == "last"
    assert sample["reward"] == [0.0, 0.5, 1.0]
    assert sample["finish_reason"] == ["stop"] * 3
