"""Scheduling on the real in-process engine, under faults: retries, attempt and batch timeouts, repeat splits.

Good tasks run the real `math` workflow. The `double_*` workflows below are test doubles for faults that real
parts cannot show on demand (raising, hanging, malformed output); nothing else is faked.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from operators.actors.gate import GateClient, StepGate
from operators.engine.client import EngineClient
from operators.rollout.operator import RolloutOperator
from operators.sinks.parquet import ParquetSink, write_fragments
from operators.tasks.reader import TasksetPlan
from operators.workflows import MathWorkflow, WorkflowBase, register_workflow
from pipelines.control.steps import StepCommitter
from schemas.config import RolloutArgs
from schemas.experience import Experience
from schemas.status import flatten_experiences
from schemas.task import Task, tasks_to_table

HANG_S = 3600.0  # how long a hanging double would take; every bound checked below is far shorter
BATCH_TIMEOUT_S = 5.0  # generous: the tiny model answers a warmed-up batch in ~0.1 s on 2 cores


@register_workflow("double_raising")
class RaisingDouble(WorkflowBase):
    """Test double: a workflow that raises on every run, a fault no real workflow shows on demand."""

    built: ClassVar[int] = 0  # instances built, to show that a failed instance is rebuilt per attempt

    def __init__(self) -> None:
        type(self).built += 1

    async def run(self, task, engine, run_id_base=0, *, repeat_times=None) -> list[Experience]:
        raise RuntimeError("double_raising: boom")


@register_workflow("double_hanging")
class HangingDouble(WorkflowBase):
    """Test double: a workflow that never finishes, like a stuck request; records that it was cancelled."""

    cancelled: ClassVar[list[str]] = []

    async def run(self, task, engine, run_id_base=0, *, repeat_times=None) -> list[Experience]:
        try:
            await asyncio.sleep(HANG_S)
        except asyncio.CancelledError:
            type(self).cancelled.append(task.task_uid)
            raise
        raise AssertionError("a hanging double outlived its bound")


@register_workflow("double_flaky")
class FlakyDouble(MathWorkflow):
    """Test double: the real math workflow, except that its first attempt at each task raises."""

    built: ClassVar[int] = 0
    failed_once: ClassVar[set[str]] = set()

    def __init__(self) -> None:
        type(self).built += 1

    async def run(self, task, engine, run_id_base=0, *, repeat_times=None) -> list[Experience]:
        if task.task_uid not in self.failed_once:
            self.failed_once.add(task.task_uid)
            raise ConnectionError("double_flaky: first attempt lost")
        return await super().run(task, engine, run_id_base, repeat_times=repeat_times)


@register_workflow("double_malformed")
class MalformedDouble(MathWorkflow):
    """Test double: the real math workflow with its logprobs cut short, output a trainer must never see."""

    async def run(self, task, engine, run_id_base=0, *, repeat_times=None) -> list[Experience]:
        experiences = await super().run(task, engine, run_id_base, repeat_times=repeat_times)
        for experience in experiences:
            experience.logprobs = experience.logprobs[:-1]
        return experiences


def make_task(uid: str, workflow: str = "math", repeat_times: int = 2, step: int = 1) -> Task:
    return Task(
        f"t/e0/{uid}",
        taskset="t",
        epoch=0,
        index=0,
        step=step,
        prompt="What is 3 + 4?",
        truth="7",
        workflow=workflow,
        reward_fn="math_accuracy",
        repeat_times=repeat_times,
        rollout_args=RolloutArgs(max_tokens=12).model_dump(),
    )


def operator(engine, **options) -> RolloutOperator:
    settings = {"max_timeout": 60.0, "max_retry_times": 0, **options}
    return RolloutOperator.from_clients([EngineClient(engine, name="local")], **settings)


def run_batch(loop, rollout: RolloutOperator, tasks: list[Task]) -> pa.Table:
    return loop.run_until_complete(rollout(tasks_to_table(tasks)))


def column(results: pa.Table, name: str) -> list:
    return results.column(name).to_pylist()


def test_batch_timeout_returns_finished_rows_and_cancels_the_rest(loop, engine, tmp_path):
    run_batch(loop, operator(engine), [make_task("warm")])  # the first request of a session is slower
    rollout = operator(
        engine, max_timeout=HANG_S, batch_timeout=BATCH_TIMEOUT_S, max_repeat_times_per_runner=1
    )
    tasks = [make_task("a"), make_task("b"), make_task("c"), make_task("h", "double_hanging")]
    started = time.monotonic()
    results = run_batch(loop, rollout, tasks)
    assert time.monotonic() - started < BATCH_TIMEOUT_S + 30  # far from the hang
    assert column(results, "ok") == [True] * 6 + [False] * 2
    cancelled = f"cancelled: batch timeout after {BATCH_TIMEOUT_S:g}s"
    assert column(results, "message")[6:] == [cancelled] * 2  # each sub-run of the hanging task
    assert column(results, "run_id_base")[6:] == [0, 1] and column(results, "attempts")[6:] == [1, 1]
    assert HangingDouble.cancelled[-2:] == ["t/e0/h"] * 2  # cancelled, not left running
    assert set(column(flatten_experiences(results), "task_uid")) == {"t/e0/a", "t/e0/b", "t/e0/c"}
    plan = TasksetPlan(files=(("t.jsonl", 4),), batch_size=4, total_epochs=1, total_steps=None)
    committer = StepCommitter(plan, ParquetSink(tmp_path), rows_per_task=2)
    (step,) = committer.add(write_fragments(results, str(tmp_path)))  # nothing dropped: the step completes
    assert step.experiences.num_rows == 6 and committer.done


def test_one_good_and_three_raising_tasks_give_four_statuses(loop, engine):
    tasks = [make_task("good"), *(make_task(f"bad{i}", "double_raising") for i in range(3))]
    results = run_batch(loop, operator(engine), tasks)
    assert results.num_rows == 4 and column(results, "ok").count(True) == 1
    assert column(results, "ok")[0] and column(results, "attempts") == [1, 1, 1, 1]
    assert all("double_raising: boom" in m for m in column(results, "message")[1:])
    experiences = flatten_experiences(results)
    assert set(column(experiences, "task_uid")) == {"t/e0/good"} and experiences.num_rows == 2


@pytest.mark.parametrize(("per_runner", "bases"), [(2, [0, 2, 4, 6]), (3, [0, 3, 6])])
def test_repeats_split_into_sub_runs_with_contiguous_run_ids(loop, engine, per_runner, bases):
    tasks = [make_task("x", repeat_times=8), make_task("y", repeat_times=8)]
    results = run_batch(loop, operator(engine, max_repeat_times_per_runner=per_runner), tasks)
    assert all(column(results, "ok")) and results.num_rows == 2 * len(bases)
    experiences = flatten_experiences(results)
    for uid in ("t/e0/x", "t/e0/y"):
        mine = results.filter(pc.equal(results.column("task_uid"), uid))
        assert column(mine, "run_id_base") == bases
        assert column(mine, "repeat_times") == [min(per_runner, 8 - b) for b in bases]
        runs = experiences.filter(pc.equal(experiences.column("task_uid"), uid))
        assert sorted(column(runs, "run_id")) == list(range(8))


def test_split_sampling_is_deterministic_per_sub_run(loop, engine):
    rollout = operator(engine, max_repeat_times_per_runner=2)

    def responses() -> list[list[int]]:
        results = run_batch(loop, rollout, [make_task("s", repeat_times=4)])
        return column(flatten_experiences(results), "response_ids")

    assert responses() == responses()


def test_a_workflow_that_raises_once_is_retried_on_a_fresh_instance(loop, engine):
    built = FlakyDouble.built
    rollout = operator(engine, max_retry_times=2)
    (row,) = run_batch(loop, rollout, [make_task("flaky", "double_flaky")]).to_pylist()
    assert (row["ok"], row["attempts"], len(row["experiences"])) == (True, 2, 2)
    assert FlakyDouble.built - built == 2
    assert len(rollout.runner.pool.idle["double_flaky"]) == 1  # the instance that failed was dropped


def test_a_workflow_that_keeps_raising_fails_after_all_retries_and_the_batch_completes(loop, engine):
    built = RaisingDouble.built
    results = run_batch(
        loop, operator(engine, max_retry_times=2), [make_task("r", "double_raising"), make_task("ok")]
    )
    assert column(results, "ok") == [False, True]
    assert column(results, "attempts") == [3, 1]
    assert column(results, "message")[0] == "attempt 3: RuntimeError: double_raising: boom"
    assert RaisingDouble.built - built == 3  # rebuilt before every attempt


def test_per_attempt_timeout_cancels_the_attempt(loop, engine):
    cancelled = len(HangingDouble.cancelled)
    rollout = operator(engine, max_timeout=0.5, max_retry_times=1)
    started = time.monotonic()
    (row,) = run_batch(loop, rollout, [make_task("slow", "double_hanging")]).to_pylist()
    assert time.monotonic() - started < 30
    assert (row["ok"], row["attempts"], row["experiences"]) == (False, 2, [])
    assert row["message"] == "attempt 2 timed out after 0.5s"
    assert HangingDouble.cancelled[cancelled:] == ["t/e0/slow", "t/e0/slow"]


def test_malformed_experiences_are_retried_then_failed_never_written(loop, engine):
    (row,) = run_batch(
        loop, operator(engine, max_retry_times=1), [make_task("m", "double_malformed")]
    ).to_pylist()
    assert (row["ok"], row["attempts"], row["experiences"]) == (False, 2, [])
    assert row["message"].startswith("attempt 2: MalformedExperience: t/e0/m/")


def test_resettable_workflows_are_reused_across_batches(loop, engine):
    rollout = operator(engine)
    run_batch(loop, rollout, [make_task("p")])
    (instance,) = rollout.runner.pool.idle["math"]
    run_batch(loop, rollout, [make_task("q")])
    assert rollout.runner.pool.idle["math"] == [instance]


def test_a_batch_across_a_gated_step_lands_its_released_part_first(loop, engine, tmp_path):
    """Ray Data cuts batches regardless of steps: the released step must commit while the next one waits."""
    rollout = operator(engine)
    gate = StepGate(released=1)
    rollout.gate, rollout.sink_root = GateClient(gate), str(tmp_path)
    tasks = [make_task("a", step=1), make_task("b", step=1), make_task("c", step=2)]
    batch = loop.create_task(rollout(tasks_to_table(tasks)))
    (first,) = loop.run_until_complete(gate.collect(timeout=60))
    assert set(column(first, "step")) == {1} and len(first) == 2 and not batch.done()
    loop.run_until_complete(gate.release(2))
    records = loop.run_until_complete(batch)
    (second,) = loop.run_until_complete(gate.collect(timeout=60))
    assert column(second, "task_uid") == ["t/e0/c"]
    assert sorted(column(records, "task_uid")) == ["t/e0/a", "t/e0/b", "t/e0/c"]
    plan = TasksetPlan(files=(("t.jsonl", 3),), batch_size=2, total_epochs=1, total_steps=None)
    committer = StepCommitter(plan, ParquetSink(tmp_path))
    assert [s.step for s in committer.add(first)] == [1]
    assert [s.step for s in committer.add(second)] == [2] and committer.done


def test_a_prompt_over_max_prompt_tokens_is_refused_at_once_or_truncated(loop, engine):
    saved = engine.prompts.max_prompt_tokens, engine.prompts.prompt_overflow
    try:
        engine.prompts.max_prompt_tokens, engine.prompts.prompt_overflow = 5, "refuse"
        results = run_batch(loop, operator(engine, max_retry_times=2), [make_task("long")])
        assert column(results, "ok") == [False] and column(results, "attempts") == [1]  # no retry
        assert "more than max_prompt_tokens=5" in column(results, "message")[0]
        assert flatten_experiences(results).num_rows == 0
        engine.prompts.prompt_overflow = "truncate"
        results = run_batch(loop, operator(engine), [make_task("cut")])
        experiences = flatten_experiences(results)
        assert column(results, "ok") == [True] and experiences.num_rows == 2
        assert all(len(ids) == 5 for ids in column(experiences, "prompt_ids"))
    finally:
        engine.prompts.max_prompt_tokens, engine.prompts.prompt_overflow = saved
