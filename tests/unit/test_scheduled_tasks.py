"""A scheduled run's inputs on plain files (no Ray): the refusals made before any engine starts, the step
tables the driver posts, feedback from a committed step's experiences, and Trinity's config drawing the same
sequence as the native one."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from operators.tasks.scheduler import Pick
from pipelines.control.feed import Feeder, task_feedback
from pipelines.control.schedule_checks import plan_training
from schemas.config import load_config, validate_tree
from schemas.errors import InputError

GRADED = (
    Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "tasksets" / "arith_graded" / "train.jsonl"
)


def taskset_file(path: Path, rows: int, features: bool = True) -> Path:
    with path.open("w") as fh:
        for i in range(rows):
            row = {"prompt": f"What is {i} + 1?", "answer": str(i + 1)}
            if features:
                row.update(weak=i / rows, strong=min(1.0, i / rows + 0.3))
            fh.write(json.dumps(row) + "\n")
    return path


def config(tmp_path: Path, change=None):
    """Two tasksets: `a` (6 rows, difficulty_based on its `weak` and `strong` columns), `b` (4, weight 2);
    `change(tasksets)` edits their tree first."""
    a, b = taskset_file(tmp_path / "a.jsonl", 6), taskset_file(tmp_path / "b.jsonl", 4, features=False)
    selector = {
        "selector_type": "difficulty_based",
        "feature_keys": ["weak", "strong"],
        "kwargs": {"tau": 0.5},
    }
    tasksets = [
        {"name": "a", "path": str(a), "data_selector": selector},
        {"name": "b", "path": str(b), "weight": 2},
    ]
    if change is not None:
        change(tasksets)
    tree = {"buffer": {"batch_size": 4, "total_epochs": 2, "explorer_input": {"tasksets": tasksets}}}
    return validate_tree(tree, "t.yaml")


def setting(index: int, key: str, value):
    def change(tasksets):
        node = tasksets[index]
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value

    return change


def test_two_tasksets_plan_a_weighted_epoch_and_step_tables(tmp_path):
    plan, tasks = plan_training(config(tmp_path))
    assert tasks is not None and plan.epoch_tasks == 6 + 2 * 4 and plan.num_steps == 7
    table, picks = tasks.step_table(1)
    assert table.num_rows == 4 and table.column("step").to_pylist() == [1] * 4
    assert [tasks.names[p.taskset] for p in picks] == table.column("taskset").to_pylist()
    assert len(set(table.column("task_uid").to_pylist())) == 4


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (
            setting(0, "data_selector.selector_type", "nope"),
            "buffer.explorer_input.tasksets.0.data_selector.selector_type",
            "unknown selector 'nope'",
        ),
        (
            setting(0, "data_selector.feature_keys", ["weak"]),
            "buffer.explorer_input.tasksets.0.data_selector.feature_keys",
            "needs 2 feature_keys, got 1",
        ),
        (setting(0, "data_selector.feature_keys", ["weak", "nothere"]), "nothere", "missing"),
        (
            setting(1, "data_selector", {"selector_type": "offline_easy2hard", "feature_keys": ["weak"]}),
            "weak",
            "missing",
        ),
    ],
)
def test_bad_selectors_are_refused_naming_the_field(tmp_path, change, field, message):
    with pytest.raises(InputError) as info:
        plan_training(config(tmp_path, change))
    assert info.value.field == field and message in str(info.value)
    if field in ("nothere", "weak"):
        assert info.value.file.endswith(".jsonl") and info.value.row == 1


def test_bad_weights_empty_tasksets_and_clashing_names_are_refused(tmp_path):
    with pytest.raises(InputError) as info:
        config(tmp_path, setting(1, "weight", 0))
    assert info.value.field == "buffer.explorer_input.tasksets.1.weight"
    with pytest.raises(InputError, match="given twice"):
        config(tmp_path, setting(1, "name", "a"))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(InputError) as info:
        plan_training(config(tmp_path, setting(1, "path", str(tmp_path / "empty.jsonl"))))
    assert "no rows" in str(info.value) and "empty.jsonl" in str(info.value)
    with pytest.raises(InputError, match="repeat_times"):
        plan_training(config(tmp_path, setting(1, "repeat_times", 2)))
    with pytest.raises(InputError, match="not both"):
        validate_tree(
            {"buffer": {"explorer_input": {"taskset": {"name": "x"}, "tasksets": [{"name": "y"}]}}}, "t"
        )


def test_feedback_is_each_picked_tasks_mean_reward():
    experiences = pa.table({"task_uid": ["x", "x", "y", "z"], "reward": [1.0, 0.0, 1.0, 0.5]})
    picked = {"x": Pick(0, 3, 0), "y": Pick(1, 2, 0)}
    assert task_feedback(experiences, picked) == {0: ([3], [0.5]), 1: ([2], [1.0])}
    assert picked == {}  # each pick's feedback is given once


def sequence(cfg, steps: int) -> list[list[tuple[str, str]]]:
    """(taskset, prompt) per task per step, with made-up feedback (a task passes when its row is even)."""
    _, tasks = plan_training(cfg)
    out = []
    for step in range(1, steps + 1):
        if not tasks.scheduler.can_draw(step):
            tasks.scheduler.feedback(tasks.scheduler.fed + 1, {})
        table, picks = tasks.step_table(step)
        out.append(
            list(zip(table.column("taskset").to_pylist(), table.column("prompt").to_pylist(), strict=True))
        )
        given: dict = {}
        for p in picks:
            rows, values = given.setdefault(p.taskset, ([], []))
            rows.append(p.row)
            values.append(float(p.row % 2 == 0))
        tasks.scheduler.feedback(step, given)
    return out


def test_a_trinity_config_draws_the_same_sequence_as_the_native_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    b = taskset_file(tmp_path / "b.jsonl", 200, features=False)
    selector = {"selector_type": "difficulty_based", "seed": 7, "feature_keys": ["weak_pass", "strong_pass"]}
    selector["kwargs"] = {"tau": 0.5, "target_reward": 0.6}
    native = {
        "buffer": {
            "batch_size": 4,
            "total_epochs": 1,
            "explorer_input": {
                "tasksets": [
                    {"name": "graded", "path": str(GRADED), "repeat_times": 2, "data_selector": selector},
                    {
                        "name": "b",
                        "path": str(b),
                        "repeat_times": 2,
                        "data_selector": {"selector_type": "shuffle"},
                    },
                ],
            },
        },
        "synchronizer": {"sync_interval": 2},
    }
    (tmp_path / "native.yaml").write_text(yaml.safe_dump(native))
    trinity = {
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "model": {"model_path": str(load_config(tmp_path / "native.yaml").model.model_path)},
        "buffer": {
            "batch_size": 4,
            "total_epochs": 1,
            "explorer_input": {
                "tasksets": [
                    {
                        "name": "graded",
                        "storage_type": "file",
                        "path": str(GRADED),
                        "task_selector": selector,
                    },
                    {
                        "name": "b",
                        "storage_type": "file",
                        "path": str(b),
                        "data_selector": {"selector_type": "shuffle"},
                    },
                ],
            },
        },
        "synchronizer": {"sync_interval": 2},
    }
    (tmp_path / "trinity.yaml").write_text(yaml.safe_dump(trinity))
    ours, theirs = load_config(tmp_path / "native.yaml"), load_config(tmp_path / "trinity.yaml")
    assert sequence(theirs, 6) == sequence(ours, 6)
    assert {name for step in sequence(ours, 6) for name, _ in step} == {"graded", "b"}


class CommittedSteps:
    """What `Feeder.restore` reads of a sink: each committed step's experiences."""

    def __init__(self):
        self.steps: dict[int, pa.Table] = {}

    def read_step(self, step: int) -> pa.Table:
        return self.steps[step]


def made_up_experiences(table: pa.Table) -> pa.Table:
    """Two samples a task; a task passes when its answer is even."""
    uids, tasksets = table.column("task_uid").to_pylist(), table.column("taskset").to_pylist()
    rewards = [float(int(t) % 2 == 0) for t in table.column("truth").to_pylist()]
    return pa.table({"task_uid": uids * 2, "taskset": tasksets * 2, "reward": rewards * 2})


def test_a_resume_replays_the_steps_committed_after_the_saved_state_and_draws_on_exactly(tmp_path):
    cfg = config(tmp_path, setting(0, "data_selector.kwargs", {"tau": 0.2, "do_sample": True}))
    uninterrupted, sink, saved = Feeder(plan_training(cfg)[1]), CommittedSteps(), {}
    tables = {}
    for step in range(1, 8):
        tables[step] = uninterrupted.draw(step)
        sink.steps[step] = made_up_experiences(tables[step])
        saved[step], figures = uninterrupted.committed(step, sink.steps[step])
        assert "selector/a/mean_pass_rate" in figures
    # the crash came after step 5 committed, before its state was saved: the state on disk is step 3's
    resumed = Feeder(plan_training(cfg)[1])
    state = resumed.restore(json.loads(json.dumps(saved[3])), sink, latest_step=5)
    assert state["next_step"] == 6 and state["fed"] == 5
    for step in (6, 7):
        assert resumed.draw(step).equals(tables[step])
        resumed.committed(step, sink.steps[step])
    assert Feeder(plan_training(cfg)[1]).restore(None, sink, latest_step=0) is None  # a fresh run


def test_a_changed_selector_is_an_identity_change_on_resume(tmp_path):
    from pipelines.control.resume_check import check_resume

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config(tmp_path).model_dump(mode="json")))
    check_resume(config(tmp_path), run_dir)  # the same config resumes
    with pytest.raises(InputError, match="buffer.explorer_input.tasksets"):
        check_resume(config(tmp_path, setting(0, "data_selector.seed", 1)), run_dir)


def test_a_recycled_tasks_feedback_is_not_applied_as_a_crash_would_lose_it(tmp_path):
    """Over-rollout's `recycle` moves a cut task on to the next step; a crash loses it (it is not run
    again), so an uninterrupted run does without its feedback too, and a resumed one draws the same."""
    feeder = Feeder(plan_training(config(tmp_path))[1])
    first, second = feeder.draw(1), feeder.draw(2)
    moved = first.column("task_uid")[0].as_py()  # cut in step 1, committed with step 2
    experiences = made_up_experiences(first)
    stays = experiences.filter(pa.compute.not_equal(experiences.column("task_uid"), moved))
    feeder.committed(1, stays)
    later = pa.concat_tables(
        [
            made_up_experiences(second),
            experiences.filter(pa.compute.equal(experiences.column("task_uid"), moved)),
        ]
    )
    feeder.committed(2, later)
    given = feeder.scheduler.history
    counted = sum(len(rows) for step in (1, 2) for rows, _ in given[step].values())
    assert counted == first.num_rows - 1 + second.num_rows  # every task once, but the moved one
    assert feeder.picked == {}  # nothing left waiting for feedback
