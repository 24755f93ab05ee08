"""Deterministic countdown tasksets bundled with rftflow.

Each puzzle is built from a known solution: numbers are drawn, then combined pairwise in a random order with
random operators (every intermediate value a positive integer) into one expression whose value is the target.
So every row is solvable, and the row keeps that `solution` (the reader ignores it; it is there for tests and
warm-up data). Rows are `{"prompt", "answer", "solution"}` with `answer` the JSON string
`{"target": T, "numbers": [a, b, ...]}` that the `countdown` reward function reads. No puzzle (target and
multiset of numbers) repeats within or across the train and eval splits.
"""

from __future__ import annotations

import argparse
import json
import operator
import random
from fractions import Fraction
from pathlib import Path

from operators.workflows.countdown import countdown_prompt

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets" / "tasksets" / "countdown"
TRAIN_SIZE, EVAL_SIZE, SEED = 500, 100, 0
NUMBER_COUNTS = (3, 4)
NUMBER_MIN, NUMBER_MAX = 1, 25
TARGET_MIN, TARGET_MAX = 2, 100

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}

Puzzle = tuple[int, tuple[int, ...]]


def combine(a: Fraction, b: Fraction, op: str) -> Fraction | None:
    """`a op b` if it is a positive integer (classic countdown rule for intermediate values), else None."""
    value = OPS[op](a, b)
    return value if value > 0 and value.denominator == 1 else None


def build_solution(rng: random.Random, numbers: list[int]) -> tuple[str, int] | None:
    """A random expression using each number once, and its value; None when a drawn step is not allowed."""
    items = [(str(n), Fraction(n)) for n in numbers]
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (left, a), (right, b) = items[i], items[j]
        op = rng.choice(list(OPS))
        value = combine(a, b, op)
        if value is None:
            return None
        items = [item for k, item in enumerate(items) if k not in (i, j)]
        items.append((f"({left} {op} {right})", value))
    expression, value = items[0]
    return expression[1:-1], int(value)


def make_row(rng: random.Random) -> dict[str, str] | None:
    numbers = [rng.randint(NUMBER_MIN, NUMBER_MAX) for _ in range(rng.choice(NUMBER_COUNTS))]
    built = build_solution(rng, numbers)
    if built is None or not TARGET_MIN <= built[1] <= TARGET_MAX:
        return None
    solution, target = built
    return {
        "prompt": countdown_prompt(numbers, target),
        "answer": json.dumps({"target": target, "numbers": numbers}),
        "solution": solution,
    }


def puzzle_of(row: dict[str, str]) -> Puzzle:
    spec = json.loads(row["answer"])
    return spec["target"], tuple(sorted(spec["numbers"]))


def generate(n: int, seed: int, exclude: frozenset[Puzzle] = frozenset()) -> list[dict[str, str]]:
    """`n` distinct puzzles drawn deterministically from `seed`, none of them in `exclude`."""
    rng = random.Random(seed)
    seen = set(exclude)
    rows: list[dict[str, str]] = []
    while len(rows) < n:
        row = make_row(rng)
        if row is not None and puzzle_of(row) not in seen:
            seen.add(puzzle_of(row))
            rows.append(row)
    return rows


def bundled_splits(
    train_size: int = TRAIN_SIZE, eval_size: int = EVAL_SIZE, seed: int = SEED
) -> dict[str, list[dict[str, str]]]:
    """The train and eval rows; with the defaults, exactly the shipped files (tests compare them)."""
    train = generate(train_size, seed)
    return {"train": train, "eval": generate(eval_size, seed + 1, frozenset(map(puzzle_of, train)))}


def write_jsonl(rows: list[dict[str, str]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.countdown_tasks",
        description=(
            "Write countdown tasksets: train.jsonl and eval.jsonl with rows {prompt, answer, solution}; "
            'answer is the JSON string {"target": T, "numbers": [...]}, read by the "countdown" reward. '
            "Deterministic; every puzzle is solvable; train and eval share no puzzle. "
            "With the defaults it rewrites the bundled files."
        ),
    )
    parser.add_argument(
        "--out-dir", type=Path, default=ASSETS_DIR, help="output directory (default: %(default)s)"
    )
    parser.add_argument(
        "--train-size", type=int, default=TRAIN_SIZE, help="train rows (default: %(default)s)"
    )
    parser.add_argument("--eval-size", type=int, default=EVAL_SIZE, help="eval rows (default: %(default)s)")
    parser.add_argument(
        "--seed", type=int, default=SEED, help="train seed; eval uses seed + 1 (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    for name, rows in bundled_splits(args.train_size, args.eval_size, args.seed).items():
        path = args.out_dir / f"{name}.jsonl"
        write_jsonl(rows, path)
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
