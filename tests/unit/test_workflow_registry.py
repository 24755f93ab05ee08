"""Workflow registry and flags, the built-in workflows on a scripted engine, `math_boxed_accuracy`, and the
eval metrics (pass@k, mean@k). No Ray, no vLLM.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from unit_factories import ScriptedEngine

from operators.engine.client import EngineClient
from operators.rollout.eval_metrics import mean_at_k, pass_at_k
from operators.rollout.rewards import last_boxed, math_boxed_accuracy
from operators.workflows import base
from operators.workflows.base import (
    WorkflowBase,
    create_workflow,
    load_builtins,
    register_workflow,
    run_workflow,
    workflow_class,
)
from schemas.experience import Experience
from schemas.task import Task

BUILTINS = ("math", "math_boxed", "countdown", "eval_math", "tool_math")


def make_task(workflow: str = "math", truth: str = "7", reward_fn: str = "math_accuracy", **kw: Any) -> Task:
    fields: dict[str, Any] = {"prompt": "What is 3 + 4?", "repeat_times": 4, "rollout_args": {"seed": 0}}
    fields.update(kw)
    return Task("t/e0/0", "t", 0, 0, 1, truth=truth, workflow=workflow, reward_fn=reward_fn, **fields)


def run(workflow: Any, task: Task, texts: list[str], **kw: Any) -> tuple[list[Experience], ScriptedEngine]:
    engine = ScriptedEngine(texts)
    return asyncio.run(run_workflow(workflow, task, EngineClient(engine), **kw)), engine


@pytest.fixture
def scratch_registry(monkeypatch):
    """A copy of the registry (built-ins loaded first), so test registrations do not leak."""
    load_builtins()
    monkeypatch.setattr(base, "WORKFLOWS", dict(base.WORKFLOWS))


# --- registry ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_are_registered_async_repeatable_and_resettable(name):
    cls = workflow_class(name)
    assert (cls.resettable, cls.repeatable, cls.asynchronous) == (True, True, True)
    workflow = create_workflow(name)
    assert isinstance(workflow, cls)
    assert workflow.reset(make_task(name)) is None


def test_unknown_workflow_names_the_known_ones():
    with pytest.raises(KeyError) as info:
        create_workflow("nope")
    assert "unknown workflow 'nope'" in str(info.value)
    assert all(name in str(info.value) for name in BUILTINS)


def test_base_defaults_and_reset():
    assert (WorkflowBase.resettable, WorkflowBase.repeatable, WorkflowBase.asynchronous) == (
        False,
        True,
        True,
    )
    with pytest.raises(NotImplementedError, match="is not resettable"):
        WorkflowBase().reset(make_task())

    class Claims(WorkflowBase):
        resettable = True

    with pytest.raises(NotImplementedError, match="does not implement reset"):
        Claims().reset(make_task())


def test_registration_checks_flags_and_run_kind(scratch_registry):
    class NoFlags:
        async def run(self, task, engine, run_id_base=0, *, repeat_times=None):
            return []

    class SyncButClaimsAsync(WorkflowBase):
        def run(self, task, engine, run_id_base=0, *, repeat_times=None):
            return []

    class AsyncButClaimsSync(WorkflowBase):
        asynchronous = False

    with pytest.raises(TypeError, match="subclass WorkflowBase"):
        register_workflow("x")(NoFlags)
    with pytest.raises(TypeError, match="needs `async def run`"):
        register_workflow("x")(SyncButClaimsAsync)
    with pytest.raises(TypeError, match="needs `def run`"):
        register_workflow("x")(AsyncButClaimsSync)
    assert "x" not in base.WORKFLOWS


def test_a_taken_name_refuses_another_class_but_not_a_reimport(scratch_registry):
    math_cls = workflow_class("math")
    with pytest.raises(ValueError, match="'math' is already registered"):
        register_workflow("math")(type("MathWorkflow", (WorkflowBase,), {}))
    assert register_workflow("math")(math_cls) is math_cls
    # A re-imported module defines a new class object with the same module and qualified name.
    again = type("MathWorkflow", (math_cls,), {"__module__": math_cls.__module__})
    assert register_workflow("math")(again) is again
    assert base.WORKFLOWS["math"] is again


# --- run_workflow: how the flags drive a workflow ---------------------------------------------------------


class Recorder(WorkflowBase):
    """Records each run call and returns one stub experience per requested repeat."""

    def __init__(self):
        self.calls: list[tuple[int, int, int]] = []

    def experiences(self, task: Task, run_id_base: int, repeat_times: int | None) -> list[Experience]:
        n = base.repeats(task, repeat_times)
        self.calls.append((run_id_base, n, threading.get_ident()))
        return [
            Experience(task.task_uid, run_id_base + i, 1, "t", 0, [1], [2], [-0.1], 0.0) for i in range(n)
        ]

    async def run(self, task, engine, run_id_base=0, *, repeat_times=None):
        return self.experiences(task, run_id_base, repeat_times)


class OneAtATime(Recorder):
    repeatable = False


class Blocking(Recorder):
    asynchronous = False

    def run(self, task, engine, run_id_base=0, *, repeat_times=None):
        return self.experiences(task, run_id_base, repeat_times)


def test_repeatable_workflow_gets_one_call_for_the_requested_range():
    workflow = Recorder()
    experiences, _ = run(workflow, make_task(), ["x"], run_id_base=2, repeat_times=2)
    assert [e.run_id for e in experiences] == [2, 3]
    assert [call[:2] for call in workflow.calls] == [(2, 2)]


def test_non_repeatable_workflow_is_run_once_per_repeat():
    workflow = OneAtATime()
    experiences, _ = run(workflow, make_task(repeat_times=3), ["x"])
    assert [e.run_id for e in experiences] == [0, 1, 2]
    assert [call[:2] for call in workflow.calls] == [(0, 1), (1, 1), (2, 1)]


def test_synchronous_workflow_runs_in_a_worker_thread():
    workflow = Blocking()
    experiences, _ = run(workflow, make_task(repeat_times=2), ["x"])
    assert [e.run_id for e in experiences] == [0, 1]
    assert workflow.calls[0][2] != threading.get_ident()


def test_repeat_times_below_one_is_refused():
    with pytest.raises(ValueError, match="repeat_times must be >= 1"):
        run(Recorder(), make_task(), ["x"], repeat_times=0)


# --- built-in single-turn workflows on a scripted engine --------------------------------------------------


def test_math_workflow_scores_each_sample_and_numbers_the_sub_range():
    experiences, engine = run(
        create_workflow("math"),
        make_task(),
        ["<answer>7</answer>", "<answer>8</answer>"],
        run_id_base=2,
        repeat_times=2,
    )
    assert [(e.run_id, e.reward, e.reward_parts) for e in experiences] == [
        (2, 1.0, {"accuracy": 1.0}),
        (3, 0.0, {"accuracy": 0.0}),
    ]
    (messages, sampling), *_ = engine.requests
    assert messages == [{"role": "user", "content": "What is 3 + 4?"}]
    assert sampling["n"] == 2 and sampling["seed"] is not None
    assert all(
        e.model_version == 7 and e.metrics["response_length"] == len(e.response_ids) for e in experiences
    )


def test_math_boxed_prompts_for_a_box_and_scores_with_its_own_reward():
    task = make_task("math_boxed", truth="\\frac{1}{2}", reward_fn="", repeat_times=2)
    experiences, engine = run(create_workflow("math_boxed"), task, ["so \\boxed{0.5}", "no box: 1/2"])
    system = engine.requests[0][0][0]
    assert system["role"] == "system" and "\\boxed{}" in system["content"]
    assert [(e.reward, e.reward_parts["format"]) for e in experiences] == [(1.0, 1.0), (0.0, 0.0)]


def test_system_prompt_and_reward_fn_from_the_task_win():
    task = make_task("math_boxed", truth="7", workflow_args={"system_prompt": "Be brief."}, repeat_times=1)
    experiences, engine = run(create_workflow("math_boxed"), task, ["<answer>7</answer>"])
    assert engine.requests[0][0][0] == {"role": "system", "content": "Be brief."}
    assert experiences[0].reward == 1.0 and "format" not in experiences[0].reward_parts  # math_accuracy


def test_countdown_workflow_defaults_to_the_countdown_reward():
    truth = '{"target": 24, "numbers": [3, 8, 1]}'
    task = make_task("countdown", truth=truth, reward_fn="", repeat_times=2)
    experiences, engine = run(create_workflow("countdown"), task, ["<answer>3 * 8 * 1</answer>", "24"])
    assert "<answer>" in engine.requests[0][0][0]["content"]
    assert [e.reward_parts for e in experiences] == [
        {"accuracy": 1.0, "format": 1.0},
        {"accuracy": 0.0, "format": 0.0},
    ]


def test_eval_math_records_accuracy_per_experience():
    task = make_task("eval_math", repeat_times=4)
    experiences, _ = run(create_workflow("eval_math"), task, ["<answer>7</answer>", "<answer>1</answer>"])
    accuracies = [e.metrics["accuracy"] for e in experiences]
    assert accuracies == [1.0, 0.0, 1.0, 0.0]
    assert mean_at_k(accuracies, 4) == 0.5
    assert pass_at_k([a >= 1.0 for a in accuracies], 2) == pytest.approx(5 / 6)


# --- math_boxed_accuracy ----------------------------------------------------------------------------------


def test_last_boxed_balances_nested_braces():
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{\\sqrt{3}}{2}} done") == "\\frac{\\sqrt{3}}{2}"
    assert last_boxed("\\boxed {x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None  # cut off mid-answer
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    ("response", "truth", "accuracy", "fmt"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0, 1.0),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0, 1.0),
        ("\\boxed{x^{2}+1}", "1+x^2", 1.0, 1.0),
        ("\\boxed{3} no, \\boxed{4}", "4", 1.0, 1.0),
        ("\\boxed{3} no, \\boxed{4}", "3", 0.0, 1.0),
        ("\\boxed{7}", "The sum is \\boxed{7}.", 1.0, 1.0),
        ("the answer is 7", "7", 0.0, 0.0),
        ("\\boxed{}", "7", 0.0, 0.0),
        ("\\boxed{7", "7", 0.0, 0.0),
    ],
    ids=[
        "fraction",
        "nested",
        "polynomial",
        "last-box",
        "earlier-box",
        "boxed-truth",
        "no-box",
        "empty",
        "open",
    ],
)
def test_math_boxed_accuracy(response, truth, accuracy, fmt):
    assert math_boxed_accuracy(response, truth) == {"reward": accuracy, "accuracy": accuracy, "format": fmt}


# --- eval metrics -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("correct", "k", "expected"),
    [
        ([1, 0, 0, 0], 1, 0.25),
        ([1, 0, 0, 0], 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        ([1, 1, 0, 0, 0], 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        ([1, 1, 1, 0], 2, 1.0),  # fewer wrong samples than k
        ([0, 0, 0], 3, 0.0),
        ([1, 1], 2, 1.0),
    ],
)
def test_pass_at_k(correct, k, expected):
    assert pass_at_k([bool(c) for c in correct], k) == pytest.approx(expected)


def test_mean_at_k_and_k_bounds():
    assert mean_at_k([1.0, 0.0, 0.5, 0.5], 2) == 0.5
    for bad in (0, 5):
        with pytest.raises(ValueError, match="k must be in 1..4"):
            pass_at_k([True] * 4, bad)
        with pytest.raises(ValueError, match="k must be in 1..4"):
            mean_at_k([1.0] * 4, bad)
