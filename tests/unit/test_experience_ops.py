"""The built-in experience ops on `pa.Table`s (no Ray): advantages checked by hand, filters, shaping, pass
rate.

Tables are built with the tasks' runs interleaved and out of order, as a batch whose repeats were split over
several runners would hold them: an op must find each group wherever its rows are.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from unit_factories import make_experience

from operators.ops.groups import groups_of, sampled_tokens
from operators.ops.registry import build_op
from schemas.experience import experiences_to_table


def table(*runs: tuple, **common) -> pa.Table:
    """A row per (task, run_id, reward[, segments]) and segment: a run of k segments is k rows, one reward."""
    experiences = []
    for task, run_id, reward, *more in runs:
        for segment in range(more[0] if more else 1):
            experiences.append(make_experience(task, run_id, reward=reward, segment=segment, **common))
    return experiences_to_table(experiences)


def column(t: pa.Table, name: str) -> list:
    return t.column(name).to_pylist()


def by_run(t: pa.Table, name: str) -> dict[tuple[str, int, int], object]:
    keys = zip(column(t, "task_uid"), column(t, "run_id"), column(t, "segment"), strict=True)
    return dict(zip(keys, column(t, name), strict=True))


# Task a: rewards [1, 0, 1, 0] (runs 0-3, split over two sub-runs and interleaved with b); b: [0, 1];
# c: one run left (its others failed); d: all agree.
MIXED = [("a", 0, 1.0), ("b", 1, 1.0), ("a", 3, 0.0), ("c", 2, 1.0), ("a", 1, 0.0), ("d", 0, 0.3)]
MIXED += [("b", 0, 0.0), ("a", 2, 1.0), ("d", 1, 0.3), ("d", 2, 0.3)]


def test_grpo_advantage_standardises_each_task_group_and_gives_lone_and_flat_groups_zero():
    out = build_op("grpo_advantage", {})(table(*MIXED))
    a = 0.5 / math.sqrt(1 / 3)  # [1, 0, 0, 1]: mean 0.5, sample std sqrt(1/3)
    b = 0.5 / math.sqrt(0.5)  # [0, 1]: mean 0.5, sample std sqrt(1/2)
    expected = [a, b, -a, 0.0, -a, 0.0, -b, a, 0.0, 0.0]
    assert out.schema.field("advantage").type == pa.float32()
    assert column(out, "advantage") == pytest.approx(expected, abs=1e-5)
    assert column(out, "reward") == column(table(*MIXED), "reward")  # nothing else changed


def test_grpo_advantage_without_std_normalisation_only_centres():
    out = build_op("grpo_advantage", {"std_normalize": False})(
        table(("a", 0, 1.0), ("a", 1, 0.0), ("a", 2, 0.0))
    )
    assert column(out, "advantage") == pytest.approx([2 / 3, -1 / 3, -1 / 3])


def test_equal_rewards_that_do_not_average_exactly_give_exactly_zero():
    out = build_op("grpo_advantage", {})(table(("t", 0, 0.9), ("t", 1, 0.9), ("t", 2, 0.9)))
    assert column(out, "advantage") == [0.0, 0.0, 0.0]


def test_rloo_advantage_is_the_reward_minus_the_mean_of_the_others():
    runs = [("a", 0, 1.0), ("a", 1, 0.0), ("a", 2, 0.5), ("a", 3, 0.5), ("lone", 0, 1.0), ("b", 0, 0.0)]
    out = build_op("rloo_advantage", {})(table(*runs, ("b", 1, 0.0)))
    expected = [1.0 - 1 / 3, 0.0 - 2 / 3, 0.5 - 1.5 / 3, 0.5 - 1.5 / 3, 0.0, 0.0, 0.0]
    assert column(out, "advantage") == pytest.approx(expected, abs=1e-6)


def test_a_runs_segments_count_once_in_its_group_and_share_its_advantage():
    # run 0 has three segments: counted per row it would pull the mean to 0.75 instead of 0.5
    out = build_op("grpo_advantage", {})(table(("a", 0, 1.0, 3), ("a", 1, 0.0)))
    advantage = by_run(out, "advantage")
    top = 0.5 / math.sqrt(0.5)
    assert [advantage[("a", 0, s)] for s in range(3)] == pytest.approx([top] * 3, abs=1e-5)
    assert advantage[("a", 1, 0)] == pytest.approx(-top, abs=1e-5)


def test_groups_span_rows_in_any_order():
    groups = groups_of(table(*MIXED))
    assert groups.num_runs == 10 and groups.num_tasks == 4
    assert groups.rows(groups.group_size()).tolist() == [4, 2, 4, 1, 4, 3, 2, 4, 3, 3]


@pytest.mark.parametrize(
    ("args", "kept"),
    [
        ({"min_reward": 0.5}, [1.0, 1.0, 1.0, 1.0]),
        ({"max_reward": 0.5}, [0.0, 0.0, 0.3, 0.0, 0.3, 0.3]),
        ({"min_reward": 0.3, "max_reward": 0.3}, [0.3, 0.3, 0.3]),
    ],
)
def test_reward_filter_drops_runs_outside_its_bounds(args, kept):
    out = build_op("reward_filter", args)(table(*MIXED))
    assert column(out, "reward") == pytest.approx(kept)


def test_reward_filter_drops_a_run_with_all_its_segments():
    out = build_op("reward_filter", {"min_reward": 0.5})(table(("a", 0, 1.0, 2), ("a", 1, 0.0, 3)))
    assert list(by_run(out, "reward")) == [("a", 0, 0), ("a", 0, 1)]


def test_reward_std_filter_drops_groups_that_agree_and_lone_runs():
    out = build_op("reward_std_filter", {})(table(*MIXED))
    assert sorted(set(column(out, "task_uid"))) == ["a", "b"]
    assert len(out) == 6


def test_reward_std_filter_threshold_uses_the_population_std():
    runs = [("low", 0, 0.0), ("low", 1, 0.2), ("high", 0, 0.0), ("high", 1, 1.0)]  # stds 0.1 and 0.5
    assert set(column(build_op("reward_std_filter", {"threshold": 0.11})(table(*runs)), "task_uid")) == {
        "high"
    }
    assert len(build_op("reward_std_filter", {"threshold": 0.09})(table(*runs))) == 4


def test_reward_shaping_penalises_sampled_tokens_beyond_the_free_ones():
    experiences = [
        make_experience("a", 0, reward=1.0, n_tokens=5),
        # a two-segment run: 4 + 3 sampled tokens, 2 of the second segment inserted (tool output)
        make_experience("a", 1, reward=1.0, n_tokens=4),
        make_experience("a", 1, reward=1.0, n_tokens=5, segment=1, action_mask=[True] * 3 + [False] * 2),
    ]
    t = experiences_to_table(experiences)
    assert sampled_tokens(t).tolist() == [5, 4, 3]
    out = build_op("reward_shaping", {"length_penalty": 0.01, "length_free_tokens": 4})(t)
    assert column(out, "reward") == pytest.approx([0.99, 0.97, 0.97])
    parts = [dict(p) for p in column(out, "reward_parts")]
    assert [p["length_penalty"] for p in parts] == pytest.approx([-0.01, -0.03, -0.03])
    assert all(p["accuracy"] == 1.0 for p in parts)  # the workflow's own parts are kept


def test_reward_shaping_format_bonus_once_per_matching_run():
    experiences = [
        make_experience("a", 0, reward=0.0, response_text="<answer>3</answer>"),
        make_experience("a", 1, reward=0.0, response_text="3"),
        make_experience("a", 1, reward=0.0, response_text="then <answer>4</answer>", segment=1),
        make_experience("a", 2, reward=0.5, response_text="no"),
    ]
    args = {"format_bonus": 0.25, "format_pattern": r"<answer>\d+</answer>"}
    out = build_op("reward_shaping", args)(experiences_to_table(experiences))
    assert column(out, "reward") == pytest.approx([0.25, 0.25, 0.25, 0.5])
    assert [dict(p)["format_bonus"] for p in column(out, "reward_parts")] == [0.25, 0.25, 0.25, 0.0]


def test_reward_shaping_twice_adds_to_its_parts():
    shaping = build_op("reward_shaping", {"length_penalty": 0.1})
    out = shaping(shaping(table(("a", 0, 1.0), n_tokens=2)))
    assert column(out, "reward") == pytest.approx([0.6])
    assert dict(column(out, "reward_parts")[0])["length_penalty"] == pytest.approx(-0.4)


def test_pass_rate_records_the_tasks_pass_rate_in_info():
    out = build_op("pass_rate", {"threshold": 1.0})(table(*MIXED))
    info = {k: json.loads(v) for k, v in by_run(out, "info").items()}
    assert info[("a", 3, 0)] == {"pass_rate": 0.5, "pass_rate_runs": 4}
    assert info[("c", 2, 0)] == {"pass_rate": 1.0, "pass_rate_runs": 1}
    assert info[("d", 0, 0)]["pass_rate"] == 0.0
    assert len(out) == len(MIXED)


def test_pass_rate_keeps_what_info_held():
    t = experiences_to_table([make_experience("a", 0, reward=1.0, info={"difficulty": 3})])
    assert json.loads(column(build_op("pass_rate", {})(t), "info")[0]) == {
        "difficulty": 3,
        "pass_rate": 1.0,
        "pass_rate_runs": 1,
    }


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("grpo_advantage", {}),
        ("rloo_advantage", {}),
        ("reward_filter", {"min_reward": 0.5}),
        ("reward_std_filter", {}),
        ("reward_shaping", {"length_penalty": 0.1, "format_bonus": 1.0, "format_pattern": "x"}),
        ("pass_rate", {}),
    ],
)
def test_every_op_takes_an_empty_table(name, args):
    empty = table()
    out = build_op(name, args)(empty)
    assert len(out) == 0 and out.schema == empty.schema


def test_advantages_are_float32_and_finite_for_large_groups():
    rng = np.random.default_rng(0)
    runs = [(f"t{i % 7}", i // 7, float(rng.integers(0, 2))) for i in range(700)]
    out = build_op("grpo_advantage", {})(table(*runs))
    values = np.array(column(out, "advantage"))
    assert np.isfinite(values).all()
    for task in {r[0] for r in runs}:
        mine = values[np.array(column(out, "task_uid")) == task]
        assert abs(mine.mean()) < 1e-5 and (
            mine.std(ddof=1) == pytest.approx(1.0, abs=1e-3) or not mine.any()
        )
