"""Benchmark statistics on plain lists: point estimates, per-task bootstrap intervals, determinism."""

from __future__ import annotations

import pytest

from pipelines.benchmark.stats import group_by_task, task_estimates


def two_per_task(correct: list[list[float]]) -> tuple[list[str], list[float], list[int]]:
    ids = [f"t{i}" for i, samples in enumerate(correct) for _ in samples]
    acc = [a for samples in correct for a in samples]
    return ids, acc, [3] * len(acc)


def test_point_estimates_follow_their_definitions():
    # task 0: both right; task 1: one of two; task 2: none
    ids, acc, lengths = two_per_task([[1, 1], [1, 0], [0, 0]])
    lengths = [2, 4, 6, 6, 1, 1]
    est = task_estimates(ids, acc, lengths)
    assert est["accuracy"].value == pytest.approx(3 / 6)
    assert est["mean_at_k"].value == pytest.approx((1 + 0.5 + 0) / 3)
    assert est["pass_at_k"].value == pytest.approx(2 / 3)
    assert est["response_length"].value == pytest.approx(20 / 6)


def test_intervals_contain_the_estimate_and_stay_in_range():
    ids, acc, lengths = two_per_task([[1, 0], [0, 0], [1, 1], [0, 1], [1, 1], [0, 0], [1, 0], [0, 0]])
    for name, est in task_estimates(ids, acc, lengths).items():
        assert est.low <= est.value <= est.high, name
        if name != "response_length":
            assert est.low >= 0.0 and est.high <= 1.0, name
    est = task_estimates(ids, acc, lengths)
    assert est["accuracy"].low < est["accuracy"].high  # the tasks differ, so the interval has width


def test_same_inputs_same_interval_and_seed_matters():
    ids, acc, lengths = two_per_task([[1, 0], [0, 0], [1, 1], [0, 1], [1, 0], [0, 0]])
    first = task_estimates(ids, acc, lengths)
    assert task_estimates(ids, acc, lengths) == first
    other = task_estimates(ids, acc, lengths, seed=7)
    assert other["accuracy"].value == first["accuracy"].value


def test_resampling_is_by_task_not_by_sample():
    """Tasks all-right or all-wrong: a per-sample bootstrap would give a narrower interval than per task."""
    ids, acc, lengths = two_per_task([[1] * 8, [0] * 8, [1] * 8, [0] * 8])
    est = task_estimates(ids, acc, lengths)["accuracy"]
    # per-task draws of 4 tasks: the mean can only be 0, 1/4, 1/2, 3/4 or 1, and reaches the extremes
    assert est.low <= 0.25 and est.high >= 0.75


def test_identical_tasks_give_a_zero_width_interval():
    ids, acc, lengths = two_per_task([[1, 0]] * 5)
    est = task_estimates(ids, acc, lengths)
    assert (est["accuracy"].low, est["accuracy"].high) == (0.5, 0.5)
    assert est["pass_at_k"].value == 1.0 and est["pass_at_k"].low == 1.0


def test_one_task_and_no_tasks():
    est = task_estimates(["a", "a"], [1.0, 0.0], [1, 1])
    assert est["accuracy"].value == est["accuracy"].low == est["accuracy"].high == 0.5
    assert task_estimates([], [], []) == {}


def test_tasks_with_fewer_samples_weigh_less_in_the_pooled_mean_only():
    # task a: 1 sample right (its other sample failed); task b: 2 samples wrong
    est = task_estimates(["a", "b", "b"], [1.0, 0.0, 0.0], [1, 1, 1])
    assert est["accuracy"].value == pytest.approx(1 / 3)
    assert est["mean_at_k"].value == pytest.approx(0.5)


def test_partial_credit_is_averaged_but_pass_needs_a_full_score():
    est = task_estimates(["a", "a"], [0.5, 0.9], [1, 1])
    assert est["accuracy"].value == pytest.approx(0.7)
    assert est["pass_at_k"].value == 0.0


def test_group_by_task_keeps_first_seen_order_and_checks_lengths():
    grouped = group_by_task(["b", "a", "b"], [1, 0, 0], [1, 2, 3])
    assert grouped.task_ids == ["b", "a"]
    assert grouped.counts.tolist() == [2, 1] and grouped.length_sum.tolist() == [4, 2]
    with pytest.raises(ValueError):
        group_by_task(["a"], [1, 0], [1])
