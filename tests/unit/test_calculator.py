"""The `tool_math` calculator: exact answers for plain arithmetic, and a clear refusal for everything else,
decided before anything large or unsafe is computed."""

from __future__ import annotations

import time

import pytest

from operators.workflows.calculator import MAX_CHARS, CalculatorError, calculate


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("47 * 83", "3901"),
        (" 12+7 ", "19"),
        ("-(3 - 10) * 2", "14"),
        ("+5 - -5", "10"),
        ("7 / 2", "3.5"),
        ("1 / 3", "0.333333333333"),
        ("6 / 3", "2"),
        ("0.1 + 0.2", "0.3"),  # exact: no binary-float residue
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("2 ** -2", "0.25"),
        ("(1 + 2) * (3 + 4)", "21"),
        ("10 ** 29", str(10**29)),
        ("(" * 99 + "1" + ")" * 99, "1"),  # as deep as MAX_CHARS allows
    ],
)
def test_arithmetic_is_exact(text: str, value: str) -> None:
    assert calculate(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty expression"),
        ("__import__('os').system('true')", "only numbers"),
        ("abs(-3)", "only numbers"),
        ("2 ** 0.5", "whole numbers"),
        ("2 ** 65", "limited to"),
        ("9 ** 9 ** 9", "limited to"),
        ("99 ** 20", "more than 30 digits"),
        ("10 ** 30", "more than 30 digits"),
        ("10 ** 29 * 10", "more than 30 digits"),
        ("1" * 31, "more than 30 digits"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("1 +", "cannot parse"),
        ("(" * 99 + "1", "cannot parse"),
        ("1" * (MAX_CHARS + 1), f"longer than {MAX_CHARS}"),
        ("3 < 4", "only numbers"),
    ],
)
def test_anything_else_is_refused_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(CalculatorError, match=message):
        calculate(text)


def test_refusals_of_huge_work_are_immediate() -> None:
    started = time.process_time()  # CPU time: what refusing costs, not how busy the machine's other core is
    for text in ("9 ** 9 ** 9", "(10 ** 29) ** 64", "-" * 150 + "9 ** 64", "9" * 200):
        with pytest.raises(CalculatorError):
            calculate(text)
    assert time.process_time() - started < 1.0
