"""Reward functions: `fn(response, truth, **args) -> {"reward": r, <part>: value, ...}` with r in [0, 1]."""

from __future__ import annotations

import re
from collections.abc import Callable

RewardFn = Callable[..., dict[str, float]]
REWARD_FNS: dict[str, RewardFn] = {}

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FORMAT = re.compile(r"^\s*<answer>[^<>]*</answer>\s*$", re.DOTALL)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def wrap(fn: RewardFn) -> RewardFn:
        if name in REWARD_FNS and REWARD_FNS[name] is not fn:
            raise ValueError(f"reward function '{name}' is already registered")
        REWARD_FNS[name] = fn
        return fn

    return wrap


def get_reward_fn(name: str) -> RewardFn:
    try:
        return REWARD_FNS[name]
    except KeyError:
        raise KeyError(f"unknown reward function '{name}' (known: {', '.join(sorted(REWARD_FNS))})") from None


def extract_answer(response: str) -> str:
    """The last <answer>…</answer> span if there is one, else the whole response."""
    found = ANSWER_TAG.findall(response)
    return found[-1] if found else response


def answers_match(candidate: str, truth: str) -> bool:
    """math-verify's equivalence (numbers, fractions, LaTeX); the standard checker for math answers."""
    from math_verify import parse, verify

    gold = parse(truth, parsing_timeout=None)
    guess = parse(candidate, parsing_timeout=None)
    return bool(gold and guess and verify(gold, guess, timeout_seconds=None))


@register_reward("math_accuracy")
def math_accuracy(response: str, truth: str) -> dict[str, float]:
    accuracy = float(answers_match(extract_answer(response), truth))
    return {"reward": accuracy, "accuracy": accuracy}


@register_reward("format")
def format_reward(response: str, truth: str) -> dict[str, float]:
    """1 when the response is exactly one <answer>…</answer> block, the format the workflow asks for."""
    score = float(bool(FORMAT.match(response)))
    return {"reward": score, "format": score}
