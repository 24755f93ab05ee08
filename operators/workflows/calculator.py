"""The calculator behind `tool_math`: evaluates what a model wrote in `<calc>…</calc>`, safely and bounded.

A model's text is untrusted input, so nothing is handed to `eval`. The text must be only digits, `.`, spaces,
parentheses and the operators `+ - * / // % **`; it is parsed with `ast` and every node is checked against a
short list (numbers, binary operators, unary plus and minus) before any of it is computed. Arithmetic is exact
(`Fraction`), and sizes are bounded before they are reached: the text's length, the exponent, and every
intermediate value, so `9**9**9` or a thousand-digit literal is refused in microseconds, never computed.
Anything refused raises `CalculatorError`, whose message says what to fix.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from decimal import Decimal, localcontext
from fractions import Fraction

MAX_CHARS = 200  # bounds literal sizes and nesting before anything is parsed
MAX_EXPONENT = 64
MAX_DIGITS = 30  # the most digits any value (operand, intermediate or result) may have
MAX_VALUE = Fraction(10**MAX_DIGITS)
RESULT_DIGITS = 12  # significant digits of a result that is not a whole number
ALLOWED_TEXT = re.compile(r"[0-9.+\-*/%() \t]+")
BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
UNARY: dict[type, Callable[[Fraction], Fraction]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot compute; the message is shown to the model."""


def parse(text: str) -> ast.expr:
    """The checked syntax tree of `text`: only numbers, `+ - * / // % **`, unary signs and parentheses."""
    text = text.strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    if not ALLOWED_TEXT.fullmatch(text):
        bad = sorted(set(re.sub(r"[0-9.+\-*/%() \t]", "", text)))
        raise CalculatorError(
            f"only numbers, + - * / // % ** and parentheses are allowed, not {''.join(bad)!r}"
        )
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"cannot parse {text!r}") from None
    for node in ast.walk(tree.body):
        allowed = (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Pow, *BINARY, *UNARY)
        if not isinstance(node, allowed):
            raise CalculatorError(f"{type(node).__name__} is not allowed in {text!r}")
        if isinstance(node, ast.Constant) and type(node.value) not in (int, float):
            raise CalculatorError(f"{node.value!r} is not a number")
    return tree.body


def bounded(value: Fraction) -> Fraction:
    """`value`, if its numerator and denominator both fit in MAX_DIGITS digits."""
    if abs(value.numerator) >= MAX_VALUE or value.denominator >= MAX_VALUE:
        raise CalculatorError(f"a value has more than {MAX_DIGITS} digits")
    return value


def power(base: Fraction, exponent: Fraction) -> Fraction:
    """`base ** exponent` for a whole exponent up to MAX_EXPONENT whose result is bounded, checked first."""
    if exponent.denominator != 1:
        raise CalculatorError("exponents must be whole numbers")
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponents are limited to ±{MAX_EXPONENT}")
    widest = max(abs(base.numerator), base.denominator)
    if widest > 1 and int(abs(exponent)) * math.log10(widest) >= MAX_DIGITS:
        raise CalculatorError(f"the power has more than {MAX_DIGITS} digits")
    return base ** int(exponent)


def evaluate(node: ast.expr) -> Fraction:
    """The exact value of a tree accepted by `parse`; every intermediate value is bounded."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError("numbers must be finite")
        return bounded(Fraction(repr(node.value)))  # repr: 0.1 is 1/10, not the nearest binary float
    if isinstance(node, ast.UnaryOp):
        return UNARY[type(node.op)](evaluate(node.operand))
    if not isinstance(node, ast.BinOp):
        raise CalculatorError(f"{type(node).__name__} is not allowed")
    left, right = evaluate(node.left), evaluate(node.right)
    try:
        if isinstance(node.op, ast.Pow):
            return bounded(power(left, right))
        return bounded(BINARY[type(node.op)](left, right))
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None


def render(value: Fraction) -> str:
    """A whole number as its digits; any other value as a decimal of RESULT_DIGITS significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    with localcontext() as context:
        context.prec = RESULT_DIGITS
        decimal = Decimal(value.numerator) / Decimal(value.denominator)
    return format(decimal.normalize(), "f")


def calculate(text: str) -> str:
    """The value of the expression `text`, rendered as the calculator's answer; raises `CalculatorError`."""
    return render(evaluate(parse(text)))
