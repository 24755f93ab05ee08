"""The `tool_math` environment without an engine: a call is answered with the calculator's result, a
malformed one with `MalformedAction`, the first reply without a call is scored and ends the run."""

from __future__ import annotations

import asyncio

import pytest

from operators.workflows import MalformedAction
from operators.workflows.base import workflow_class
from operators.workflows.env import env_parts
from operators.workflows.tool_math import TOOL_SYSTEM_PROMPT, CalculatorEnv
from schemas.task import Task


def task(**kw) -> Task:
    fields = {"prompt": "What is 47 * 83?", "truth": "3901", "workflow": "tool_math", "reward_fn": ""}
    return Task("t/e0/0", "t", 0, 0, 1, **{**fields, **kw})


def test_a_call_is_answered_then_the_copied_result_is_scored():
    env = CalculatorEnv(task())
    assert env.reset(task()) == "What is 47 * 83?"
    assert asyncio.run(env.step("<calc>47 * 83</calc>")) == ("3901", 0.0, False)
    assert asyncio.run(env.step("<answer>3901</answer>")) == ("", 1.0, True)
    assert env_parts(env) == {"accuracy": 1.0, "tool_calls": 1.0, "called_tool": 1.0}


def test_a_direct_answer_ends_the_run_with_no_call():
    env = CalculatorEnv(task())
    assert asyncio.run(env.step("<answer>3900</answer>")) == ("", 0.0, True)
    assert env_parts(env) == {"accuracy": 0.0, "tool_calls": 0.0, "called_tool": 0.0}


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("<calc>47 * 83", "without </calc>"),
        ("<calc>47 x 83</calc>", "calculator: only numbers"),
        ("<calc>9 ** 99</calc>", "calculator: exponents are limited"),
        ("<calc>1 / 0</calc>", "calculator: division by zero"),
    ],
)
def test_a_malformed_call_raises_malformed_action_and_counts_as_a_call(reply, message):
    env = CalculatorEnv(task())
    with pytest.raises(MalformedAction, match=message):
        asyncio.run(env.step(reply))
    assert env_parts(env) == {"tool_calls": 1.0, "called_tool": 1.0}  # no answer yet: no accuracy


def test_the_tasks_reward_function_and_chat_messages_are_honoured():
    chat = task(prompt=None, messages=[{"role": "user", "content": "What is 2 * 3?"}], reward_fn="format")
    env = CalculatorEnv(chat)
    assert env.reset(chat) == "What is 2 * 3?"
    assert asyncio.run(env.step("<answer>7</answer>")) == ("", 1.0, True)  # well-formed, though wrong
    assert env_parts(env) == {"format": 1.0, "tool_calls": 0.0, "called_tool": 0.0}


def test_the_workflow_speaks_as_the_tool_role_under_the_calculator_system_prompt():
    cls = workflow_class("tool_math")
    assert cls.observation_role == "tool" and cls.default_system_prompt == TOOL_SYSTEM_PROMPT
    assert "<calc>" in TOOL_SYSTEM_PROMPT
