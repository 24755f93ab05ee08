"""The workflow runner's pure parts: repeat splitting, result rows, run-id checks, the workflow pool.

No Ray, no vLLM: faults on a real engine are in tests/engine/test_runner_faults.py.
"""

from __future__ import annotations

import json

import pytest
from unit_factories import make_experience

from operators.rollout.operator import RolloutOperator
from operators.rollout.runner import (
    SubRun,
    WorkflowPool,
    check_experiences,
    describe,
    mean_metrics,
    runs_per_task,
    split_task,
)
from schemas.experience import MalformedExperience
from schemas.status import RESULT_SCHEMA, results_to_table
from schemas.task import Task


def make_task(repeat_times: int = 8, workflow: str = "math", uid: str = "t/e0/0") -> Task:
    return Task(
        uid,
        "t",
        0,
        0,
        1,
        truth="7",
        workflow=workflow,
        reward_fn="",
        prompt="3+4?",
        repeat_times=repeat_times,
    )


# --- splitting ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("repeat_times", "per_runner", "expected"),
    [
        (8, 2, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        (5, 2, [(0, 2), (2, 2), (4, 1)]),
        (8, 3, [(0, 3), (3, 3), (6, 2)]),
        (3, 8, [(0, 3)]),
        (4, None, [(0, 4)]),
        (1, 1, [(0, 1)]),
    ],
)
def test_split_task_runs_bases_m_apart_asking_for_the_rest(repeat_times, per_runner, expected):
    subs = split_task(make_task(repeat_times), per_runner)
    assert [(s.run_id_base, s.repeat_times) for s in subs] == expected
    assert runs_per_task(repeat_times, per_runner) == len(expected)


@pytest.mark.parametrize("per_runner", [None, 1, 2, 3, 7, 20])
def test_sub_runs_cover_run_ids_exactly_once(per_runner):
    for repeat_times in range(1, 13):
        subs = split_task(make_task(repeat_times), per_runner)
        run_ids = [base for s in subs for base in range(s.run_id_base, s.run_id_base + s.repeat_times)]
        assert run_ids == list(range(repeat_times))
        assert len(subs) == runs_per_task(repeat_times, per_runner)


# --- result rows ------------------------------------------------------------------------------------------


def test_ok_row_carries_its_sub_run_metrics_and_experiences():
    sub = SubRun(make_task(), 2, 2, attempts=2)
    experiences = [make_experience(run_id=r, reward=float(r % 2), metrics={"len": 2.0 * r}) for r in (2, 3)]
    row = sub.ok_row("engine-0", experiences)
    assert (row["ok"], row["attempts"], row["runner"], row["message"]) == (True, 2, "engine-0", None)
    assert (row["run_id_base"], row["repeat_times"], row["task_run_time"]) == (2, 2, 0.0)
    assert json.loads(row["metric"]) == {"reward": 0.5, "len": 5.0, "task_run_time": 0.0}
    assert [e["run_id"] for e in row["experiences"]] == [2, 3]
    assert results_to_table([row]).schema.equals(RESULT_SCHEMA)


def test_failed_row_carries_no_experiences_but_its_run_time():
    sub = SubRun(make_task(), 4, 2, attempts=3, started=0.0)
    row = sub.failed_row("engine-1", "attempt 3: RuntimeError: boom")
    assert (row["ok"], row["attempts"], row["message"], row["experiences"]) == (
        False,
        3,
        "attempt 3: RuntimeError: boom",
        [],
    )
    assert row["task_run_time"] > 0 and json.loads(row["metric"]) == {"task_run_time": row["task_run_time"]}


def test_mean_metrics_of_no_experiences_is_empty():
    assert mean_metrics([]) == {}


def test_describe_reports_the_root_cause_on_one_line():
    try:
        try:
            raise ValueError("deep\nreason")
        except ValueError as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as exc:
        assert describe(exc) == "ValueError: reason"
    assert describe(ValueError()) == "ValueError: "


# --- run-id and shape checks --------------------------------------------------------------------------------


def test_check_experiences_accepts_exactly_the_asked_run_ids_in_any_order():
    check_experiences([make_experience(run_id=r) for r in (3, 2)], SubRun(make_task(), 2, 2))


@pytest.mark.parametrize(
    ("run_ids", "uid", "match"),
    [
        ([2], "t/e0/0", r"run ids \[2\] where 2..3"),
        ([2, 2, 3], "t/e0/0", r"t/e0/0/2: segments \[0, 0\], where 0..1 once each"),
        ([2, 3, 4], "t/e0/0", r"run ids \[2, 3, 4\]"),
        ([0, 1], "t/e0/0", r"run ids \[0, 1\] where 2..3"),
        ([2, 3], "t/e0/9", "produced for task t/e0/0"),
    ],
    ids=["missing", "duplicate", "extra", "wrong-base", "other-task"],
)
def test_check_experiences_refuses_what_would_corrupt_the_sink(run_ids, uid, match):
    with pytest.raises(MalformedExperience, match=match):
        check_experiences([make_experience(uid, r) for r in run_ids], SubRun(make_task(), 2, 2))


def test_check_experiences_validates_each_experience():
    with pytest.raises(MalformedExperience, match="empty response_ids"):
        check_experiences([make_experience(run_id=0, n_tokens=0)], SubRun(make_task(1), 0, 1))


# --- workflow pool ----------------------------------------------------------------------------------------


def test_pool_reuses_a_released_resettable_instance_for_the_next_task():
    pool = WorkflowPool()
    first = pool.acquire(make_task(uid="t/e0/0"))
    pool.release(make_task(uid="t/e0/0"), first)
    assert pool.acquire(make_task(uid="t/e0/1")) is first


def test_pool_never_shares_an_instance_and_drops_one_not_released():
    pool = WorkflowPool()
    busy, failed = pool.acquire(make_task()), pool.acquire(make_task())
    assert busy is not failed
    pool.release(make_task(), busy)  # `failed` is never released: it is dropped
    assert pool.acquire(make_task()) is busy
    assert pool.acquire(make_task()) not in (busy, failed)


def test_pool_raises_for_an_unknown_workflow():
    with pytest.raises(KeyError, match="unknown workflow 'nope'"):
        WorkflowPool().acquire(make_task(workflow="nope"))


# --- rollout operator without engines ---------------------------------------------------------------------


def test_rollout_operator_needs_an_engine():
    with pytest.raises(ValueError, match="at least one engine"):
        RolloutOperator.from_clients([], max_timeout=1.0, max_retry_times=0)
