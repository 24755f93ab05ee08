"""The math workflow and its runner on a real in-process vLLM CPU engine, fed from a Task table."""

from __future__ import annotations

import pyarrow.compute as pc

from operators.engine.client import EngineClient
from operators.rollout.runner import run_task
from schemas.config import RolloutArgs
from schemas.status import flatten_experiences, results_to_table
from schemas.task import Task, tasks_from_table, tasks_to_table

REPEAT = 4


def make_tasks(count: int, reward_fn: str = "math_accuracy") -> list[Task]:
    problems = [("What is 3 + 4?", "7"), ("What is 12 + 30?", "42"), ("What is 9 - 5?", "4")]
    return [
        Task(
            f"t/e0/{i}",
            taskset="t",
            epoch=0,
            index=i,
            step=1,
            prompt=problems[i % len(problems)][0],
            truth=problems[i % len(problems)][1],
            workflow="math",
            reward_fn=reward_fn,
            repeat_times=REPEAT,
            rollout_args=RolloutArgs(max_tokens=12).model_dump(),
        )
        for i in range(count)
    ]


def run_table(loop, engine, tasks: list[Task]):
    """Tasks through an Arrow table, as the rollout operator receives them, then run concurrently."""
    import asyncio

    client = EngineClient(engine)
    decoded = tasks_from_table(tasks_to_table(tasks))

    async def run_all() -> list[dict]:
        return await asyncio.gather(
            *(run_task(t, client, max_timeout=60, max_retry_times=0) for t in decoded)
        )

    return results_to_table(loop.run_until_complete(run_all()))


def test_each_task_yields_repeat_times_scored_experiences(loop, engine):
    results = run_table(loop, engine, make_tasks(3))
    assert results.column("ok").to_pylist() == [True] * 3
    experiences = flatten_experiences(results)
    assert experiences.num_rows == 3 * REPEAT
    for task_uid in ("t/e0/0", "t/e0/1", "t/e0/2"):
        runs = experiences.filter(pc.equal(experiences.column("task_uid"), task_uid))
        assert sorted(runs.column("run_id").to_pylist()) == list(range(REPEAT))
    for row in experiences.to_pylist():
        assert row["response_ids"] and len(row["logprobs"]) == len(row["response_ids"])
        assert all(lp <= 0 for lp in row["logprobs"])
        assert row["reward"] in (0.0, 1.0)
        assert dict(row["reward_parts"])["accuracy"] == row["reward"]
        assert row["model_version"] == 0
        assert "What is" in row["prompt_text"]


def test_same_task_samples_the_same_responses(loop, engine):
    first = flatten_experiences(run_table(loop, engine, make_tasks(1)))
    again = flatten_experiences(run_table(loop, engine, make_tasks(1)))
    assert first.column("response_ids").to_pylist() == again.column("response_ids").to_pylist()


def test_failing_task_is_reported_not_dropped(loop, engine):
    results = run_table(loop, engine, make_tasks(2, reward_fn="no_such_reward"))
    assert results.num_rows == 2
    assert results.column("ok").to_pylist() == [False, False]
    assert all("no_such_reward" in m for m in results.column("message").to_pylist())
    assert flatten_experiences(results).num_rows == 0
