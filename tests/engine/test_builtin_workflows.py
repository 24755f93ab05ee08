"""The built-in `math_boxed`, `countdown` and `eval_math` workflows end to end on the real in-process engine.

The tiny model only learned `<answer>N</answer>` arithmetic, so these check structure, not accuracy.
"""

from __future__ import annotations

import json

import pytest

from operators.engine.client import EngineClient
from operators.rollout.runner import run_task
from operators.workflows.base import create_workflow
from pipelines.reference.countdown_tasks import ASSETS_DIR
from schemas.config import RolloutArgs
from schemas.task import Task

REPEAT = 3
COUNTDOWN = json.loads((ASSETS_DIR / "eval.jsonl").read_text().splitlines()[0])
CASES = {
    "math_boxed": ("What is 3 + 4?", "7", "math_boxed_accuracy", {"accuracy", "format"}),
    "countdown": (COUNTDOWN["prompt"], COUNTDOWN["answer"], "countdown", {"accuracy", "format"}),
    "eval_math": ("What is 12 + 30?", "42", "math_accuracy", {"accuracy"}),
}


def make_task(workflow: str) -> Task:
    prompt, truth, reward_fn, _ = CASES[workflow]
    return Task(
        f"{workflow}/e0/0",
        taskset=workflow,
        epoch=0,
        index=0,
        step=1,
        prompt=prompt,
        truth=truth,
        workflow=workflow,
        reward_fn=reward_fn,
        repeat_times=REPEAT,
        rollout_args=RolloutArgs(max_tokens=12).model_dump(),
    )


@pytest.mark.parametrize("workflow", list(CASES))
def test_workflow_runs_end_to_end(loop, engine, workflow):
    result = loop.run_until_complete(
        run_task(make_task(workflow), EngineClient(engine), max_timeout=60, max_retry_times=0)
    )
    assert result["ok"], result["message"]
    experiences = result["experiences"]
    assert sorted(e["run_id"] for e in experiences) == list(range(REPEAT))
    for row in experiences:
        assert 0.0 <= row["reward"] <= 1.0
        assert {name for name, _ in row["reward_parts"]} == CASES[workflow][3]
        assert row["response_ids"] and len(row["logprobs"]) == len(row["response_ids"])
        assert ("<|system|>" in row["prompt_text"]) == (workflow != "eval_math")  # default system prompts
        assert ("accuracy" in json.loads(row["metrics"])) == (workflow == "eval_math")


def test_a_sub_range_of_repeats_gets_its_own_run_ids(loop, engine):
    workflow = create_workflow("countdown")
    experiences = loop.run_until_complete(
        workflow.run(make_task("countdown"), EngineClient(engine), 2, repeat_times=2)
    )
    assert [e.run_id for e in experiences] == [2, 3]
    for experience in experiences:
        experience.validate()
