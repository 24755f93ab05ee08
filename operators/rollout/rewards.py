"""The built-in reward functions, `fn(response, truth, **args) -> {"reward": r, <part>: value, ...}`, r in
[0, 1].

They register in `operators.rollout.reward_registry`. Plugins once imported `register_reward` from here; that
still works, with a DeprecationWarning naming `operators.workflows`.
"""

from __future__ import annotations

import ast
import json
import logging
import operator
import re
from decimal import Decimal
from fractions import Fraction

from operators.rollout import reward_registry
from operators.rollout.moved import moved_names

logging.getLogger("math_verify").setLevel(logging.ERROR)

# Plugins once imported the registry from here: it keeps working, with a warning naming the new import.
__getattr__ = moved_names(
    "operators.rollout.rewards",
    {
        "register_reward": "operators.workflows",
        "get_reward_fn": "operators.workflows",
        "RewardFn": "operators.workflows",
        "REWARD_FNS": "operators.rollout.reward_registry",
    },
)

PLAIN_NUMBER = re.compile(r"^\s*-?\d+(\.\d+)?\s*$")
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FORMAT = re.compile(r"^\s*<answer>[^<>]*</answer>\s*$", re.DOTALL)
BOXED = re.compile(r"\\boxed\s*\{")
MAX_BOXED_CHARS = 1000  # longer "answers" are not answers, and sympy can take minutes on them
EQUATION = re.compile(r"[0-9+\-*/() \t\n]+")
MAX_EQUATION_CHARS = 200  # bounds literal sizes and nesting before anything is parsed
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
EQUATION_NODES = (ast.Expression, ast.BinOp, ast.Constant, *OPERATORS)


def extract_answer(response: str) -> str:
    """The last <answer>…</answer> span if there is one, else the whole response."""
    found = ANSWER_TAG.findall(response)
    return found[-1] if found else response


def answers_match(candidate: str, truth: str) -> bool:
    """math-verify's equivalence (numbers, fractions, LaTeX); the standard checker for math answers.

    Two plain decimal numbers are compared exactly without it: the common case, ~1000x cheaper, same verdict.
    """
    if PLAIN_NUMBER.match(candidate) and PLAIN_NUMBER.match(truth):
        return Decimal(candidate.strip()) == Decimal(truth.strip())
    from math_verify import parse, verify  # heavy (0.4 s), deferred: most answers are plain numbers

    gold = parse(truth, parsing_timeout=None)
    guess = parse(candidate, parsing_timeout=None)
    return bool(gold and guess and verify(gold, guess, timeout_seconds=None))


@reward_registry.register_warm_up
def import_math_verify() -> None:
    """`answers_match`'s deferred import, made ahead (`warm_up_rewards`)."""
    import math_verify  # noqa: F401  (heavy, deferred: see answers_match)


def final_answer(truth: str) -> str:
    """The answer in a truth that is a worked solution: GSM8K's `… #### 1,234` (thousands commas dropped), or
    the last `\\boxed{}`; any other truth is the answer itself."""
    if "####" in truth:
        return truth.rsplit("####", 1)[-1].strip().replace(",", "")
    return last_boxed(truth) or truth


@reward_registry.register_reward("math_accuracy")
def math_accuracy(response: str, truth: str) -> dict[str, float]:
    """math-verify between the response's answer (its last `<answer>` block, else all of it) and the truth's
    final answer (`final_answer`)."""
    accuracy = float(answers_match(extract_answer(response), final_answer(truth)))
    return {"reward": accuracy, "accuracy": accuracy}


@reward_registry.register_reward("format")
def format_reward(response: str, truth: str) -> dict[str, float]:
    """1 when the response is exactly one <answer>…</answer> block, the format the workflow asks for."""
    score = float(bool(FORMAT.match(response)))
    return {"reward": score, "format": score}


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{…}`, nested braces included; None if absent or left unclosed."""
    found = list(BOXED.finditer(text))
    if not found:
        return None
    start = found[-1].end()
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


@reward_registry.register_reward("math_boxed_accuracy")
def math_boxed_accuracy(response: str, truth: str) -> dict[str, float]:
    """math-verify on the last `\\boxed{}` answer; `format` is 1 when there is one.

    Both sides are compared boxed, which makes math-verify read them as LaTeX (bare `\\sqrt{2}` or `x^2+1`
    would not parse). A truth that is itself a worked solution is reduced to its last boxed answer.
    """
    answer = (last_boxed(response) or "").strip()
    accuracy = 0.0
    if answer and len(answer) <= MAX_BOXED_CHARS:
        gold = final_answer(truth)
        accuracy = float(answers_match(f"\\boxed{{{answer}}}", f"\\boxed{{{gold}}}"))
    return {"reward": accuracy, "accuracy": accuracy, "format": float(bool(answer))}


def parse_equation(text: str) -> ast.expr | None:
    """The equation's syntax tree if it is integers joined by + - * / with parentheses, else None.

    Checked before anything is evaluated: only these characters and node types pass, so `**`, names, calls
    and attribute access (`__import__('os')`, `9**9**9`) are refused, never run.
    """
    text = text.strip()
    if not text or len(text) > MAX_EQUATION_CHARS or not EQUATION.fullmatch(text):
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, EQUATION_NODES):
            return None
        if isinstance(node, ast.Constant) and type(node.value) is not int:
            return None
    return tree.body


def evaluate(node: ast.expr) -> Fraction:
    """Exact value of a tree accepted by `parse_equation`; raises ZeroDivisionError on division by zero."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if not isinstance(node, ast.BinOp):
        raise TypeError(f"not an equation node: {type(node).__name__}")
    return OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))


def countdown_truth(truth: str) -> tuple[Fraction, list[int]]:
    """`{"target": T, "numbers": [a, b, …]}` as JSON; a malformed truth is a taskset bug, so it raises."""
    try:
        spec = json.loads(truth)
        target, numbers = Fraction(spec["target"]), [int(n) for n in spec["numbers"]]
    except (ValueError, TypeError, KeyError) as exc:
        expected = '{"target": T, "numbers": [...]}'
        raise ValueError(f"countdown truth must be JSON {expected}, got {truth!r:.80}") from exc
    return target, numbers


@reward_registry.register_reward("countdown")
def countdown(response: str, truth: str) -> dict[str, float]:
    """1 when the last <answer> equation uses exactly the given numbers and equals the target.

    `format` is 1 when the last <answer> holds a parsable equation, whatever numbers it uses.
    """
    target, numbers = countdown_truth(truth)
    found = ANSWER_TAG.findall(response)
    tree = parse_equation(found[-1]) if found else None
    if tree is None:
        return {"reward": 0.0, "accuracy": 0.0, "format": 0.0}
    used = sorted(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant))
    try:
        correct = used == sorted(numbers) and abs(float(evaluate(tree) - target)) < 1e-6
    except (ZeroDivisionError, RecursionError, OverflowError):
        correct = False
    return {"reward": float(correct), "accuracy": float(correct), "format": 1.0}
