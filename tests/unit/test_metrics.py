"""Step metrics on hand-made tables: rewards, lengths, throughput, failures; the MLflow samples table."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest
from unit_factories import make_experience, make_results

from pipelines.control.metrics import SAMPLE_COLUMNS, sample_table, step_metrics
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
    """Task records of the step: two ok tasks and one failed."""
    return make_results([("a", 1, 2), ("b", 1, 1), ("c", 1, 0)]).select(["task_uid", "step", "ok"])


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
            "rollout/tokens_per_s": 3.0,
            "rollout/failed_tasks": 1.0,
            "pipeline/experience_count": 3.0,
            "time/step": 4.0,
            "rollout/model_version": 2.0,
            "rollout/turns/mean": 1.0,
            "rollout/turns/max": 1,
            "rollout/turns/min": 1,
            "rollout/trajectory_splits": 0.0,
            "rollout/staleness/mean": 2.0,
            "rollout/staleness/max": 3,
            "rollout/staleness/min": 0,
            "rollout/stale_dropped": 2.0,
        }
    )


def test_zero_seconds_gives_zero_throughput(experiences, records):
    assert step_metrics(experiences, records, seconds=0.0)["rollout/tokens_per_s"] == 0.0


def test_metrics_of_a_step_where_every_task_failed(records):
    failed = records.filter(pc.equal(records["task_uid"], "c"))
    metrics = step_metrics(EXPERIENCE_SCHEMA.empty_table(), failed, 2.0)
    assert metrics == {
        "rollout/tokens_per_s": 0.0,
        "rollout/failed_tasks": 1.0,
        "rollout/stale_dropped": 0.0,
        "pipeline/experience_count": 0.0,
        "time/step": 2.0,
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
