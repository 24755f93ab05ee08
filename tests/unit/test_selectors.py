"""Selectors, the taskset mix and the scheduler's feedback-lag rule, on plain data (no Ray)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from operators.tasks.scheduler import TaskScheduler, TasksetMix
from operators.tasks.selectors import (
    SelectorBase,
    feature_count_problem,
    register_selector,
    selector_class,
)
from schemas.selector_config import SelectorConfig


def make(kind: str, size: int, features=None, **kwargs) -> SelectorBase:
    cfg = SelectorConfig(selector_type=kind, seed=3, kwargs=kwargs)
    feats = np.zeros((size, 0)) if features is None else np.asarray(features, dtype=float)
    return selector_class(kind)(size, feats, cfg)


def test_sequential_wraps_in_file_order():
    s = make("sequential", 5)
    assert s.next(3) == [0, 1, 2]
    assert s.next(4) == [3, 4, 0, 1]


def test_shuffle_is_a_new_permutation_each_epoch_and_resumes():
    s = make("shuffle", 6)
    first, second = s.next(6), s.next(6)
    assert sorted(first) == sorted(second) == list(range(6))
    assert first != second
    again = make("shuffle", 6)
    again.load_state_dict(json.loads(json.dumps(make("shuffle", 6).state_dict() | {"drawn": 6})))
    assert again.next(6) == second


def test_random_draws_without_repeats_inside_a_draw_and_is_seeded():
    a, b = make("random", 10), make("random", 10)
    draws = [a.next(4) for _ in range(3)]
    assert draws == [b.next(4) for _ in range(3)]
    assert all(len(set(d)) == 4 for d in draws)
    assert len({tuple(d) for d in draws}) > 1


def test_easy2hard_sorts_by_features_highest_first():
    s = make("offline_easy2hard", 4, [[0.1], [0.9], [0.5], [0.9]])
    assert s.next(4) == [1, 3, 2, 0]  # ties keep file order
    assert s.next(1) == [1]  # each epoch starts again from the easiest
    assert s.figures([1, 3]) == {"feature_mean": pytest.approx(0.9)}


def test_feature_key_counts():
    assert feature_count_problem(selector_class("difficulty_based"), 1) == "needs 2 feature_keys, got 1"
    assert (
        feature_count_problem(selector_class("offline_easy2hard"), 0)
        == "needs at least 1 feature_keys, got 0"
    )
    assert feature_count_problem(selector_class("shuffle"), 0) is None
    with pytest.raises(KeyError, match="unknown selector 'nope'"):
        selector_class("nope")


def test_plugins_register_selectors():
    @register_selector("test_reverse")
    class Reverse(SelectorBase):
        def next(self, count):
            rows = [self.size - 1 - (self.drawn + i) % self.size for i in range(count)]
            self.drawn += count
            return rows

    assert make("test_reverse", 3).next(4) == [2, 1, 0, 2]
    with pytest.raises(TypeError, match="must subclass"):
        register_selector("test_bad")(object)


def difficulty(size=8, **kwargs) -> SelectorBase:
    weak = np.linspace(0.0, 0.7, size)
    return make("difficulty_based", size, np.stack([weak, weak + 0.3], axis=1), **kwargs)


def test_difficulty_learns_from_feedback_and_picks_near_the_target():
    s = difficulty(tau=0, target_reward=0.5)
    before = s.figures([0])["estimated_pass_rate"]
    s.feedback([0, 0, 7], [0.0, 0.0, 1.0])  # task 0 failed twice, task 7 passed
    assert s.figures([0])["estimated_pass_rate"] < before
    assert s.figures([7])["estimated_pass_rate"] > s.figures([0])["estimated_pass_rate"]
    picks = s.next(2)
    means = s.alphas / (s.alphas + s.betas)
    assert set(picks) == set(np.argsort(np.abs(means - 0.5), kind="stable")[:2].tolist())


def test_difficulty_sampled_draws_are_seeded_and_its_whole_state_resumes():
    a = difficulty(tau=0.1, do_sample=True)
    a.feedback([1, 2], [0.25, 1.0])
    saved = json.loads(json.dumps(a.state_dict()))
    b = difficulty(tau=0.1, do_sample=True)
    b.load_state_dict(saved)
    for _ in range(3):
        assert a.next(3) == b.next(3)
        a.feedback([4], [0.5])
        b.feedback([4], [0.5])
    assert a.state_dict() == b.state_dict()


def test_mix_is_proportional_to_size_times_weight_and_reshuffled_per_epoch():
    mix = TasksetMix([6, 2], [1.0, 2.0], seed=0)
    assert mix.epoch_length == 10
    first, second = mix.tasksets_at(0, 10), mix.tasksets_at(10, 10)
    assert Counter(first) == Counter(second) == {0: 6, 1: 4}
    assert first != second
    assert mix.tasksets_at(8, 4) == first[8:] + second[:2]
    assert TasksetMix([6, 2], [1.0, 2.0], seed=0).tasksets_at(0, 10) == first


def scheduler(lag: int, kinds=("sequential", "difficulty_based")) -> TaskScheduler:
    selectors = [make(kinds[0], 4), difficulty(6, tau=0.5)] if kinds[1] == "difficulty_based" else None
    return TaskScheduler(selectors, TasksetMix([4, 6], [1.0, 1.0], seed=1), batch_size=4, lag=lag)


def fake_feedback(step: int, picks) -> dict:
    """Made-up feedback: a task passes when (row + step) is even."""
    out: dict = {}
    for p in picks:
        rows, values = out.setdefault(p.taskset, ([], []))
        rows.append(p.row)
        values.append(float((p.row + step) % 2 == 0))
    return out


def run(sched: TaskScheduler, steps: range, picks_by_step: dict, feed_upto: int) -> None:
    for step in steps:
        picks_by_step[step] = sched.draw(step, 4)
        for done in range(sched.fed + 1, min(step, feed_upto) + 1):
            sched.feedback(done, fake_feedback(done, picks_by_step[done]))


def test_feedback_lag_rule_and_exact_resume_from_a_checkpoint():
    sched = scheduler(lag=1)
    picks: dict = {}
    assert sched.can_draw(1) and sched.can_draw(2) and not sched.can_draw(3)
    with pytest.raises(ValueError, match="needs the feedback of step 1"):
        sched.draw(1, 4), sched.draw(2, 4), sched.draw(3, 4)
    sched = scheduler(lag=1)
    run(sched, range(1, 9), picks, feed_upto=8)
    # a second run stops after committing step 4, while step 5 (and 6) were already drawn
    other, seen = scheduler(lag=1), {}
    run(other, range(1, 6), seen, feed_upto=4)
    saved = json.loads(json.dumps(other.checkpoint(4)))
    assert saved["next_step"] == 5 and saved["fed"] == 4
    resumed = scheduler(lag=1)
    resumed.load_state_dict(saved)
    redo = {step: seen[step] for step in range(1, 5)}
    for step in range(5, 9):
        redo[step] = resumed.draw(step, 4)
        resumed.feedback(step, fake_feedback(step, redo[step]))
    assert redo == picks
    assert len({p.taskset for p in picks[1] + picks[2]}) == 2


def test_uncommitted_feedback_is_never_in_a_checkpoint():
    sched = scheduler(lag=0)
    p1 = sched.draw(1, 4)
    sched.feedback(1, fake_feedback(1, p1))
    saved = sched.checkpoint(1)
    p2 = sched.draw(2, 4)
    assert saved["fed"] == 1 and set(saved["pending"]) <= {"1"}
    resumed = scheduler(lag=0)
    resumed.load_state_dict(json.loads(json.dumps(saved)))
    assert resumed.draw(2, 4) == p2


def test_the_difficulty_pool_example_plugin_draws_from_its_pools_and_resumes():
    from pathlib import Path

    from operators.rollout.plugins import load_plugins

    load_plugins(Path(__file__).resolve().parents[2] / "examples" / "selectors")
    pool = make("difficulty_pool", 6, weights={"learning": 1.0, "unseen": 0.0})
    first = pool.next(4)  # nothing measured: every task is unseen, the only pool with tasks
    pool.feedback([0, 1, 2], [0.5, 1.0, 0.0])
    assert pool.figures([]) == {
        "pool_unseen": 3.0,
        "pool_failed": 1.0,
        "pool_learning": 1.0,
        "pool_solved": 1.0,
    }
    assert pool.next(3) == [0, 0, 0]  # only `learning` has weight, and task 0 alone is in it
    again = make("difficulty_pool", 6, weights={"learning": 1.0, "unseen": 0.0})
    again.load_state_dict(json.loads(json.dumps(pool.state_dict())))
    assert again.next(5) == pool.next(5) and len(first) == 4
