"""Cutting the straggler tail on the real in-process engine: over-rollout, the dynamic timeout, and requests
aborted as hopeless after a sync. The hanging workflow is the test double of `test_runner_faults` (a stuck
request is a fault real parts cannot show on demand), and `double_late` a straggler on demand (real lengths
vary); every other task runs the real `math` workflow."""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

import pytest
from test_runner_faults import HANG_S, HangingDouble, column, make_task, operator, run_batch

from operators.actors.gate import GateClient, StepGate
from operators.engine.client import EngineClient
from operators.rollout.over_rollout import DEFERRED, SKIPPED
from operators.rollout.runner import DynamicTimeout, SubRun, WorkflowRunner
from operators.sinks.parquet import ParquetSink, write_fragments
from operators.tasks.reader import TasksetPlan
from operators.workflows import MathWorkflow, register_workflow
from pipelines.control.steps import StepCommitter
from schemas.errors import STALE, StaleRequest
from schemas.rollout_policy import DynamicTimeoutConfig, OverRolloutConfig
from schemas.status import flatten_experiences
from schemas.task import tasks_to_table

LATE_S = 3.0  # how long the straggler double waits before it samples: far past the quick tasks' ~0.1 s


@register_workflow("double_late")
class LateDouble(MathWorkflow):
    """Test double: the real math workflow after `LATE_S`, a straggler on demand; counts its runs per task."""

    runs: ClassVar[dict[str, int]] = {}

    async def run(self, task, engine, run_id_base=0, *, repeat_times=None):
        type(self).runs[task.task_uid] = type(self).runs.get(task.task_uid, 0) + 1
        await asyncio.sleep(LATE_S)
        return await super().run(task, engine, run_id_base, repeat_times=repeat_times)


def test_over_rollout_ends_the_batch_once_most_are_done_and_records_the_rest_as_skipped(
    loop, engine, tmp_path
):
    run_batch(loop, operator(engine), [make_task("warm")])  # the first request of a session is slower
    cut = OverRolloutConfig(ratio=0.2, wait_after_min=0.5)
    rollout = operator(engine, max_timeout=HANG_S, over_rollout=cut)
    tasks = [make_task(uid) for uid in "abcd"] + [make_task("h", "double_hanging")]
    started = time.monotonic()
    results = run_batch(loop, rollout, tasks)
    assert time.monotonic() - started < 30  # far from the hang: 4 of 5 done, then 0.5 s of grace
    assert column(results, "ok") == [True] * 4 + [False]
    assert column(results, "message")[4] == f"{SKIPPED} (ratio 0.2)"
    assert HangingDouble.cancelled[-1] == "t/e0/h"  # cancelled, not left running
    plan = TasksetPlan(files=(("t.jsonl", 5),), batch_size=5, total_epochs=1, total_steps=None)
    committer = StepCommitter(plan, ParquetSink(tmp_path))
    (step,) = committer.add(write_fragments(results, str(tmp_path)))  # the skipped task is accounted for
    assert committer.done and set(column(step.experiences, "task_uid")) == {f"t/e0/{u}" for u in "abcd"}


def test_without_over_rollout_a_batch_waits_for_every_task(loop, engine):
    rollout = operator(engine, over_rollout=OverRolloutConfig(ratio=0.0, wait_after_min=0.0))
    results = run_batch(loop, rollout, [make_task(uid) for uid in "abc"])
    assert column(results, "ok") == [True] * 3
    assert len(flatten_experiences(results)) == 6


def test_the_dynamic_timeout_bounds_an_attempt_by_the_mean_task_time(loop, engine):
    dynamic = DynamicTimeoutConfig(enable=True, ratio=3.0, min_samples=2)
    rollout = operator(engine, max_timeout=HANG_S, dynamic_timeout=dynamic)
    run_batch(loop, rollout, [make_task("a"), make_task("b")])  # two quick tasks set the mean
    bound = rollout.runner.timeout()
    assert 0 < bound < 60  # 3 x a fraction of a second, far below max_timeout
    started = time.monotonic()
    (row,) = run_batch(loop, rollout, [make_task("slow", "double_hanging")]).to_pylist()
    assert time.monotonic() - started < bound * 3 + 30
    assert row["ok"] is False
    assert row["message"] == f"attempt 1 timed out after {round(rollout.runner.timeout(), 3):g}s"


def test_the_dynamic_timeout_waits_for_enough_samples():
    timeout = DynamicTimeout(ratio=2.0, min_samples=3)
    timeout.observe(1.0)
    timeout.observe(2.0)
    assert timeout.bound(100.0) == 100.0  # two samples: max_timeout still rules
    timeout.observe(3.0)
    assert timeout.bound(100.0) == pytest.approx(4.0)  # 2 x mean(1, 2, 3)
    assert timeout.bound(3.0) == 3.0  # never above max_timeout


def test_a_request_aborted_as_hopeless_raises_stale_and_counts_its_tokens(loop, engine):
    wasted = engine.counters()["wasted_tokens"]
    version = engine.model_version
    sampling = {"n": 1, "temperature": 1.0, "max_tokens": 200, "ignore_eos": True, "seed": 0}

    async def scenario() -> tuple[int, BaseException | None]:
        request = asyncio.ensure_future(engine.generate("What is 3 + 4?", sampling))
        while not engine.dispatched:  # in flight: admitted and stamped with its version
            await asyncio.sleep(0.001)
        aborted = await engine.abort_older_than(version + 1)
        try:
            await request
        except StaleRequest as exc:
            return aborted, exc
        return aborted, None

    aborted, error = loop.run_until_complete(scenario())
    assert aborted == 1 and isinstance(error, StaleRequest)
    assert f"version {version}" in str(error)
    assert engine.counters()["wasted_tokens"] >= wasted  # what it sampled before the abort, when reported
    assert not engine.dispatched and not engine.hopeless and engine.in_flight == 0
    assert loop.run_until_complete(engine.abort_older_than(version)) == 0  # nothing older is left


def test_a_stale_sub_run_ends_at_once_unretried(loop, engine):
    class StaleClient(EngineClient):
        """Test double: every request aborted as hopeless, as after a sync (that moment, on demand)."""

        async def chat(self, messages, sampling):
            raise StaleRequest("sampled on version 0, which can no longer commit within max_staleness")

    runner = WorkflowRunner(max_timeout=60.0, max_retry_times=2)
    row = loop.run_until_complete(runner.run(SubRun(make_task("s"), 0, 2), StaleClient(engine, name="local")))
    assert row["ok"] is False and row["attempts"] == 1
    assert row["message"].startswith(f"{STALE} attempt 1: StaleRequest: sampled on version 0")


def recycling_operator(engine, sink: str, gate: StepGate, last_step: int):
    """An over-rollout operator with `recycle`, writing to `sink`, reporting through `gate` (in-process)."""
    rollout = operator(engine, over_rollout=OverRolloutConfig(ratio=0.2, recycle=True))
    rollout.sink_root, rollout.gate, rollout.last_step = sink, GateClient(gate), last_step
    return rollout


def test_over_rollout_recycle_commits_the_cut_task_with_the_next_step_once_not_restarted(
    loop, engine, tmp_path
):
    run_batch(loop, operator(engine), [make_task("warm")])  # the first request of a session is slower
    gate, sink = StepGate(released=2), str(tmp_path)
    rollout = recycling_operator(engine, sink, gate, last_step=2)
    run_batch(loop, rollout, [make_task(uid) for uid in "abcd"] + [make_task("late", "double_late")])
    first, second = gate.reports  # step 1 reported at once, the moved task once it was done
    assert column(first, "step") == [1] * 5 and column(first, "ok") == [True] * 4 + [False]
    assert column(first, "message")[4] == f"{DEFERRED} to step 2"
    assert column(second, "task_uid") == ["t/e0/late"] and column(second, "ok") == [True]
    assert column(second, "step") == [2]
    assert min(column(second, "finished_at")) - max(column(first, "finished_at")) > LATE_S / 2
    assert LateDouble.runs["t/e0/late"] == 1  # it went on: never cancelled, never run again

    plan = TasksetPlan(files=(("t.jsonl", 10),), batch_size=5, total_epochs=1, total_steps=None)
    committer = StepCommitter(plan, ParquetSink(tmp_path))
    (one,) = committer.add(first)
    assert list(committer.add(second)) == []  # step 2 has its own five tasks to wait for too
    own = loop.run_until_complete(operator(engine, over_rollout=None)(tasks_to_table(
        [make_task(uid, step=2) for uid in "efghi"]
    )))  # fmt: skip
    (two,) = committer.add(write_fragments(own, sink))
    assert set(column(one.experiences, "task_uid")) == {f"t/e0/{u}" for u in "abcd"}
    assert set(column(two.experiences, "task_uid")) == {f"t/e0/{u}" for u in "efghi"} | {"t/e0/late"}
    assert set(column(two.experiences, "step")) == {2} and two.experiences.num_rows == 12


def test_over_rollout_recycle_skips_the_last_steps_tail(loop, engine, tmp_path):
    gate = StepGate(released=1)
    rollout = recycling_operator(engine, str(tmp_path), gate, last_step=1)
    results = run_batch(loop, rollout, [make_task(uid) for uid in "abcd"] + [make_task("end", "double_late")])
    assert column(results, "message")[4] == f"{SKIPPED} (ratio 0.2)" and len(gate.reports) == 1
