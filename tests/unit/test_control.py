"""StepCommitter: steps commit in order, once, when all their tasks' sub-runs have reported (ok or failed)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from unit_factories import make_result, make_results

from operators.rollout.over_rollout import DEFERRED
from operators.sinks.parquet import ParquetSink, write_fragments
from operators.tasks.reader import TasksetPlan
from pipelines.control.metrics import step_metrics
from pipelines.control.state import lost_carried, save_carried
from pipelines.control.steps import StepCommitter, sub_run_keys
from schemas.status import flatten_experiences, results_to_table


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


PLAN = TasksetPlan(files=(("tasks.jsonl", 10),), batch_size=4, total_epochs=1, total_steps=None)


@pytest.fixture
def committer(tmp_path, clock):
    """10 tasks, 4 per step: steps of 4, 4 and 2 tasks."""
    return StepCommitter(PLAN, ParquetSink(tmp_path / "experiences"), clock=clock)


@pytest.fixture
def split_committer(tmp_path, clock):
    """The same plan with each task's repeats split into 2 sub-runs (e.g. repeat_times 4, 2 per runner)."""
    return StepCommitter(PLAN, ParquetSink(tmp_path / "experiences"), clock=clock, rows_per_task=2)


def report(committer: StepCommitter, spec: list[tuple]):
    """Write the tasks' fragments like a writer stage would and hand the records to the committer."""
    return list(committer.add(write_fragments(make_results(spec), str(committer.sink.root))))


def tasks(step: int, uids: str, n_experiences: int = 1) -> list[tuple[str, int, int]]:
    return [(uid, step, n_experiences) for uid in uids]


def test_out_of_order_steps_wait_for_earlier_steps(committer, clock):
    assert report(committer, tasks(2, "efgh")) == []
    assert report(committer, tasks(1, "abc")) == []
    assert committer.sink.committed_steps() == []
    clock.now += 5.0
    done = report(committer, tasks(1, "d"))
    assert [c.step for c in done] == [1, 2]
    assert committer.sink.committed_steps() == [1, 2]
    assert sorted(done[0].records.column("task_uid").to_pylist()) == list("abcd")
    assert sorted(done[1].experiences.column("uid").to_pylist()) == [f"{u}/0" for u in "efgh"]
    assert [c.seconds for c in done] == [5.0, 0.0]
    assert committer.next_step == 3 and not committer.done


def test_done_after_the_final_partial_step(committer, clock):
    report(committer, tasks(1, "abcd"))
    report(committer, tasks(2, "efgh", n_experiences=2))
    clock.now += 2.5
    assert report(committer, tasks(3, "i")) == []
    assert not committer.done
    clock.now += 1.0
    done = report(committer, tasks(3, "j", n_experiences=3))
    assert [c.step for c in done] == [3]
    assert done[0].seconds == 3.5
    assert done[0].experiences.num_rows == 4
    assert committer.done


def test_a_batch_may_complete_several_steps_and_failed_tasks_count(committer):
    records = write_fragments(
        make_results([*tasks(1, "abc"), ("d", 1, 0), *tasks(2, "efg", 0), ("h", 2, 2)]),
        str(committer.sink.root),
    )
    done = list(committer.add(records))
    assert [c.step for c in done] == [1, 2]
    assert done[0].experiences.num_rows == 3 and done[1].experiences.num_rows == 2
    assert done[1].records.column("ok").to_pylist().count(False) == 3


def test_steps_a_report_completes_commit_one_at_a_time_as_they_are_taken(committer):
    """The explorer logs each step before the next commits: killed between, at most one lacks its metrics."""
    records = write_fragments(make_results([*tasks(1, "abcd"), *tasks(2, "efgh")]), str(committer.sink.root))
    ready = committer.add(records)
    assert committer.sink.committed_steps() == []
    assert next(ready).step == 1 and committer.sink.committed_steps() == [1]
    assert next(ready).step == 2 and committer.sink.committed_steps() == [1, 2]
    assert next(ready, None) is None


def test_a_step_of_failed_tasks_commits_empty(committer):
    done = report(committer, tasks(1, "abcd", n_experiences=0))
    assert [c.step for c in done] == [1]
    assert done[0].experiences.num_rows == 0 and done[0].records.num_rows == 4


def test_a_task_reported_twice_in_one_batch_raises(committer):
    with pytest.raises(RuntimeError, match="a task reported twice in one batch"):
        report(committer, tasks(2, "ee"))


def test_a_retried_batch_is_dropped_as_a_repeat_before_and_after_its_commit(committer):
    assert report(committer, tasks(1, "ab")) == []
    assert report(committer, tasks(1, "ab")) == []  # the retry of a batch that had reported
    (done,) = report(committer, tasks(1, "cd"))
    assert report(committer, tasks(1, "cd")) == []  # the step is committed: its repeat changes nothing
    assert committer.repeats == 4
    uids = sorted(done.experiences.column("uid").to_pylist())
    assert uids == sorted(set(uids)) and len(uids) == done.experiences.num_rows
    assert sorted(done.records.column("task_uid").to_pylist()) == sorted(
        set(done.records["task_uid"].to_pylist())
    )


def test_an_empty_batch_commits_nothing(committer):
    empty = write_fragments(make_results([]), str(committer.sink.root))
    assert isinstance(empty, pa.Table) and empty.num_rows == 0
    assert list(committer.add(empty)) == []
    assert committer.next_step == 1


def sub_runs(step: int, uids: str, base: int) -> list[tuple[str, int, int, int]]:
    """One sub-run of 2 experiences (run ids base, base+1) for each task."""
    return [(uid, step, 2, base) for uid in uids]


def test_a_split_step_commits_once_every_sub_run_has_reported(split_committer):
    assert report(split_committer, sub_runs(1, "abcd", 0)) == []
    assert report(split_committer, sub_runs(1, "abc", 2)) == []
    (done,) = report(split_committer, [("d", 1, 0, 2)])  # a failed sub-run completes its step too
    uids = sorted(done.experiences.column("uid").to_pylist())
    assert uids == [f"{u}/{run}" for u in "abcd" for run in range(4)][:-2]  # all but d/2 and d/3
    records = done.records
    keys = sorted(sub_run_keys(records))
    assert keys == [(u, base) for u in "abcd" for base in (0, 2)]
    assert records.column("ok").to_pylist().count(False) == 1
    assert split_committer.next_step == 2


def test_a_sub_run_reported_again_is_dropped(split_committer):
    report(split_committer, sub_runs(1, "a", 2))
    assert report(split_committer, sub_runs(1, "a", 2)) == []
    assert split_committer.repeats == 1 and split_committer.seen[1] == {("a", 2)}


def test_rows_per_task_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="rows_per_task must be >= 1"):
        StepCommitter(PLAN, ParquetSink(tmp_path), rows_per_task=0)


def deferred(uid: str, step: int):
    """The record of a task over-rollout moved on from `step` (`recycle`): no experiences yet."""
    return make_result(uid, step, 0, ok=False, message=f"{DEFERRED} to step {step + 1}")


def test_a_recycled_task_commits_with_the_next_step_which_waits_for_it(tmp_path, clock):
    told = []
    committer = StepCommitter(
        PLAN, ParquetSink(tmp_path / "experiences"), clock=clock, on_deferred=lambda s, u: told.append((s, u))
    )
    records = results_to_table([*(make_result(u, 1, 1) for u in "abc"), deferred("d", 1)])
    (first,) = committer.add(write_fragments(records, str(committer.sink.root)))
    assert first.experiences.column("task_uid").to_pylist() == list("abc")
    assert told == [(1, ["d"])]  # before step 1 committed: what a crash resume would have lost
    assert report(committer, tasks(2, "efgh")) == []  # step 2's own tasks: it still waits for d
    (second,) = report(committer, [("d", 2, 1)])
    assert sorted(second.experiences.column("task_uid").to_pylist()) == list("defgh")
    assert told[-1] == (2, [])
    assert set(committer.sink.read_step(1).column("task_uid").to_pylist()) == set("abc")  # d once, in step 2


def test_a_deferred_record_is_neither_failed_nor_skipped_but_recycled():
    records = results_to_table([make_result("a", 1, 1), deferred("b", 1)])
    metrics = step_metrics(flatten_experiences(records), records, 1.0)
    assert (metrics["rollout/recycled_tasks"], metrics["rollout/failed_tasks"]) == (1.0, 0.0)
    assert metrics["rollout/skipped_tasks"] == 0.0


def test_lost_carried_names_the_last_committed_steps_moved_tasks_only(tmp_path):
    assert lost_carried(tmp_path, 3) == []  # no file: nothing was moved
    save_carried(tmp_path, 3, ["t/e0/7"])
    assert lost_carried(tmp_path, 3) == ["t/e0/7"]  # step 3 committed, step 4 (holding it) did not
    assert lost_carried(tmp_path, 2) == []  # written for step 3, which a crash kept from committing
