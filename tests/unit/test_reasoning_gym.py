"""reasoning-gym tasksets: generated rows that stream, repeat for a seed and resume like a file's; refused
before any engine starts when the dataset, its args or its size are wrong; and the `reasoning_gym` reward, the
family's own scorer given the task's info. No Ray, no vLLM.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pydantic import ValidationError

from operators.rollout.reward_registry import get_reward_fn
from operators.tasks.reader import iter_task_tables, plan_taskset, read_units
from schemas.config import TasksetConfig
from schemas.errors import InputError
from schemas.task import Task, tasks_from_table

CHAIN_SUM = {"dataset": "chain_sum", "args": {"min_terms": 2, "max_terms": 3}, "size": 10, "seed": 7}


def rg_taskset(**changes) -> TasksetConfig:
    return TasksetConfig(
        name="cs", reasoning_gym={**CHAIN_SUM, **changes}, default_reward_fn_type="reasoning_gym"
    )


def read(cfg: TasksetConfig, first_step: int = 1, batch_size: int = 4, epochs: int = 1) -> list[Task]:
    plan = plan_taskset(cfg, batch_size, epochs, None)
    units = read_units(plan, first_step)
    tables = [t for unit in units for t in iter_task_tables(cfg, plan, *unit, first_step=first_step)]
    return tasks_from_table(pa.concat_tables(tables))


def test_the_same_seed_gives_the_same_tasks_and_another_seed_others():
    first, again, other = read(rg_taskset()), read(rg_taskset()), read(rg_taskset(seed=8))
    assert len(first) == 10 and [t.prompt for t in first] == [t.prompt for t in again]
    assert [t.truth for t in first] == [t.truth for t in again]
    assert [t.prompt for t in first] != [t.prompt for t in other]
    assert first[0].info["dataset"] == "chain_sum" and first[0].info["metadata"]["source_index"] == 0
    assert [t.step for t in first] == [1] * 4 + [2] * 4 + [3] * 2


def test_a_resumed_read_continues_the_sequence_across_epochs():
    whole = read(rg_taskset(), epochs=2)
    resumed = read(rg_taskset(), first_step=3, epochs=2)  # steps 1-2 committed: 8 of the 20 tasks
    assert [(t.task_uid, t.prompt, t.step) for t in resumed] == [
        (t.task_uid, t.prompt, t.step) for t in whole[8:]
    ]


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"dataset": "chian_sum"}, "reasoning_gym.dataset", "did you mean chain_sum"),
        ({"args": {"min_terms": 5, "max_terms": 3}}, "reasoning_gym.args", "max_terms must be >= min_terms"),
        ({"args": {"bogus": 1}}, "reasoning_gym.args", "unexpected keyword argument 'bogus'"),
        ({"args": {"seed": 1}}, "reasoning_gym.args", "give seed as reasoning_gym.seed"),
    ],
)
def test_a_wrong_dataset_or_args_is_refused_at_planning_naming_the_field(changes, field, fragment):
    with pytest.raises(InputError, match=fragment) as caught:
        plan_taskset(rg_taskset(**changes), 4, 1, None)
    assert caught.value.field == field and caught.value.file.startswith("reasoning_gym:")


def test_size_zero_and_a_path_beside_reasoning_gym_are_refused_by_the_config():
    with pytest.raises(ValidationError) as caught:
        rg_taskset(size=0)
    assert caught.value.errors()[0]["loc"] == ("reasoning_gym", "size")
    with pytest.raises(ValidationError, match="drop path"):
        TasksetConfig(path="train.jsonl", reasoning_gym=CHAIN_SUM)


def test_the_reasoning_gym_reward_is_the_family_scorer_given_the_task_info():
    task = read(rg_taskset())[0]
    score = get_reward_fn("reasoning_gym")
    assert score(f"<answer>{task.truth}</answer>", task.truth, info=task.info)["reward"] == 1.0
    assert score(f"<answer>{int(task.truth) + 1}</answer>", task.truth, info=task.info)["reward"] == 0.0
    assert score(f"{task.truth} is it", task.truth, info=task.info)["reward"] == 0.0  # no <answer>: none


def test_a_family_without_a_single_answer_scores_by_its_metadata():
    cfg = TasksetConfig(reasoning_gym={"dataset": "propositional_logic", "size": 2, "seed": 3})
    task = read(cfg, batch_size=2)[0]
    assert task.truth == ""
    parts = get_reward_fn("reasoning_gym")("<answer>nonsense</answer>", task.truth, info=task.info)
    assert 0.0 <= parts["reward"] < 1.0


def test_reasoning_gym_is_imported_only_when_a_taskset_or_reward_uses_it():
    code = (
        "import sys; from operators.tasks.reader import plan_taskset; "
        "from operators.rollout.reward_registry import get_reward_fn; get_reward_fn('reasoning_gym'); "
        "assert 'reasoning_gym' not in sys.modules, 'imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=Path(__file__).parents[2])
