"""Reward functions: math-verify equivalence on the <answer> span, and the format check."""

from __future__ import annotations

import pytest

from operators.rollout.reward_registry import REWARD_FNS, get_reward_fn
from operators.rollout.rewards import (
    answers_match,
    extract_answer,
    format_reward,
    math_accuracy,
    math_boxed_accuracy,
)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("<answer>68</answer>", "68", 1.0),
        ("<answer>67</answer>", "68", 0.0),
        ("<answer>-7</answer>", "-7", 1.0),
        ("<answer>7</answer>", "-7", 0.0),
        ("<answer>-7</answer>", "7", 0.0),
        ("<answer>0.5</answer>", "1/2", 1.0),
        ("<answer>1</answer> no wait <answer>2</answer>", "2", 1.0),
        ("<answer>1</answer> no wait <answer>2</answer>", "1", 0.0),
        ("68", "68", 1.0),
        ("The answer is 68", "68", 1.0),
        ("I do not know", "68", 0.0),
        ("<answer></answer>", "0", 0.0),
    ],
    ids=[
        "right",
        "wrong",
        "negative",
        "sign-dropped",
        "sign-added",
        "equivalent-fraction",
        "last-tag-counts",
        "earlier-tag-ignored",
        "no-tag-bare",
        "no-tag-sentence",
        "no-number",
        "empty-tag",
    ],
)
def test_math_accuracy(response, truth, expected):
    assert math_accuracy(response, truth) == {"reward": expected, "accuracy": expected}


def test_extract_answer_takes_the_last_tag_or_the_whole_text():
    assert extract_answer("x <answer> 3 </answer> y <answer>4</answer>") == "4"
    assert extract_answer("<answer>multi\nline</answer>") == "multi\nline"
    assert extract_answer("no tags at all") == "no tags at all"


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<answer>68</answer>", 1.0),
        ("  <answer>68</answer>\n", 1.0),
        ("The answer is <answer>68</answer>", 0.0),
        ("<answer>68</answer> done", 0.0),
        ("<answer>1</answer><answer>2</answer>", 0.0),
        ("68", 0.0),
    ],
    ids=["exact", "surrounding-space", "text-before", "text-after", "two-blocks", "no-tag"],
)
def test_format_reward(response, expected):
    assert format_reward(response, "68") == {"reward": expected, "format": expected}


def test_registry_and_unknown_names():
    assert get_reward_fn("math_accuracy") is math_accuracy
    assert get_reward_fn("format") is format_reward
    with pytest.raises(KeyError) as info:
        get_reward_fn("nope")
    message = str(info.value)
    assert "unknown reward function 'nope'" in message
    assert all(name in message for name in REWARD_FNS)
    assert "format" in message and "math_accuracy" in message


def test_register_refuses_a_second_function_under_a_taken_name(monkeypatch):
    from operators.rollout import reward_registry as rewards

    monkeypatch.setattr(rewards, "REWARD_FNS", dict(REWARD_FNS))
    with pytest.raises(ValueError, match="'format' is already registered"):
        rewards.register_reward("format")(lambda response, truth: {"reward": 0.0})
    assert rewards.register_reward("format")(format_reward) is format_reward  # same function: no-op

    def always(response, truth):
        return {"reward": 1.0}

    rewards.register_reward("always")(always)
    assert rewards.get_reward_fn("always")("x", "y") == {"reward": 1.0}
    assert "always" not in REWARD_FNS  # the real registry is untouched


@pytest.mark.parametrize(
    "candidate,truth",
    [("68", "68"), (" -3 ", "-3"), ("2.50", "2.5"), ("+7", "7"), ("67", "68"), ("1/2", "0.5"), ("x", "1")],
)
def test_plain_number_fast_path_agrees_with_math_verify(candidate, truth):
    from math_verify import parse, verify

    expected = bool(verify(parse(truth, parsing_timeout=None), parse(candidate, parsing_timeout=None)))
    assert answers_match(candidate, truth) is expected


@pytest.mark.parametrize(
    ("truth", "response", "right"),
    [
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "<answer>72</answer>", 1.0),
        ("It costs 1,000 + 234.\n#### 1,234", "<answer>1234</answer>", 1.0),
        ("#### 72", "<answer>24</answer>", 0.0),
        ("so the answer is \\boxed{\\frac{1}{2}}", "<answer>0.5</answer>", 1.0),
    ],
)
def test_worked_solution_truths_are_scored_by_their_final_answer(truth, response, right):
    assert math_accuracy(response, truth)["accuracy"] == right


def test_boxed_accuracy_reads_a_gsm8k_truth_too():
    assert math_boxed_accuracy("so \\boxed{72}", "48 + 24 = 72\n#### 72")["accuracy"] == 1.0
