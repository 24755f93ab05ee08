"""Where `math_accuracy` and reasoning-gym's scorers disagree, over generated tasks of numeric families: every
response shape below is scored by both, and each shape's disagreements must be the ones listed (docs/
workflows.md, "Where scorers disagree"). A new disagreement, or a listed one that is gone, fails the test.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from operators.rollout.reward_registry import get_reward_fn
from operators.rollout.rewards import math_accuracy
from operators.tasks.reader import iter_task_tables, plan_taskset, read_units
from schemas.config import TasksetConfig
from schemas.task import Task, tasks_from_table

FAMILIES = (
    "chain_sum",
    "basic_arithmetic",
    "products",
    "decimal_arithmetic",
    "fraction_simplification",
    "power_function",
)
MATH_HIGHER, RG_HIGHER = "math_accuracy higher", "reasoning-gym higher"
# shape: (response made from the truth T, the directions its disagreements take)
SHAPES = {
    "tagged": ("<answer>{t}</answer>", set()),
    "tagged, padded": ("<answer> {t} </answer>", set()),
    "two tags, the last right": ("<answer>0</answer> no: <answer>{t}</answer>", set()),
    # math_accuracy reads an untagged response whole; reasoning-gym finds no answer (0, or 0.01 for some)
    "untagged": ("{t}", {MATH_HIGHER}),
    "untagged, with words": ("{t} is it", {MATH_HIGHER}),
    # math-verify finds the number among words or LaTeX; reasoning-gym's default scorer gives partial credit
    # len(T)/len(answer) when T is a substring, and stricter families parse the answer and give 0
    "tagged, with words": ("<answer>The answer is {t}</answer>", {MATH_HIGHER}),
    # ... and math-verify reads no number in a boxed `1.7e-22`: 0, where power_function gives any answer 0.01
    "tagged, boxed": ("<answer>\\boxed{{{t}}}</answer>", {MATH_HIGHER, RG_HIGHER}),
    # an equal number written otherwise: math-verify's equality; string-matching families' partial credit
    "tagged, .0 appended": ("<answer>{t}.0</answer>", {MATH_HIGHER}),
    # a wrong answer holding the right one: reasoning-gym's substring credit, or its tolerance for decimals;
    # math-verify's own precision accepts some (a long decimal, a fraction) with a digit appended
    "tagged, a digit appended": ("<answer>{t}1</answer>", {MATH_HIGHER, RG_HIGHER}),
}


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    found = []
    for family in FAMILIES:
        cfg = TasksetConfig(name=family, reasoning_gym={"dataset": family, "size": 8, "seed": 1})
        plan = plan_taskset(cfg, 8, 1, None)
        tables = [t for unit in read_units(plan) for t in iter_task_tables(cfg, plan, *unit)]
        found += tasks_from_table(pa.concat_tables(tables))
    return found


@pytest.mark.parametrize("shape", SHAPES)
def test_each_response_shape_disagrees_only_as_listed(tasks, shape):
    template, expected = SHAPES[shape]
    reasoning_gym = get_reward_fn("reasoning_gym")
    directions = set()
    for task in tasks:
        response = template.format(t=task.truth)
        ours = math_accuracy(response, task.truth)["reward"]
        theirs = reasoning_gym(response, task.truth, info=task.info)["reward"]
        if ours != theirs:
            directions.add(MATH_HIGHER if ours > theirs else RG_HIGHER)
    assert directions == expected


def test_the_known_untagged_case_scores_one_and_zero(tasks):
    task = next(t for t in tasks if t.taskset == "chain_sum")
    response = f"{task.truth} is it"
    assert math_accuracy(response, task.truth)["reward"] == 1.0
    assert get_reward_fn("reasoning_gym")(response, task.truth, info=task.info)["reward"] == 0.0
