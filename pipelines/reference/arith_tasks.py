"""Deterministic arithmetic tasksets bundled with rftflow.

The mix spans easy (memorisable 1-digit) to hard (3-digit / multi-digit products) problems so the
tiny default model solves some but not all of them, which gives RL a real reward signal. Train and
eval prompts are disjoint by construction: a stable hash of each prompt assigns it to exactly one
split, so both splits share the same difficulty mix without ever overlapping.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets" / "tasksets" / "arith"
TRAIN_SIZE, TRAIN_SEED = 2000, 0
EVAL_SIZE, EVAL_SEED = 200, 1
EVAL_FRACTION_PERCENT = 20  # share of the prompt space reserved for the eval split

Problem = tuple[str, int]
Kinds = list[tuple[int, Callable[[random.Random], Problem]]]


def binary(lo_a: int, hi_a: int, lo_b: int, hi_b: int, op: str) -> Callable[[random.Random], Problem]:
    """Return a sampler for `a op b` with operands drawn uniformly from the given inclusive ranges."""

    def sample(rng: random.Random) -> Problem:
        a, b = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b)
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return f"What is {a} {op} {b}?", value

    return sample


# (weight, sampler): easy kinds first; weights sum to 100 so the mix reads as percentages.
KINDS: Kinds = [
    (25, binary(0, 9, 0, 9, "+")),
    (20, binary(0, 9, 0, 9, "-")),
    (15, binary(0, 9, 0, 9, "*")),
    (12, binary(10, 99, 10, 99, "+")),
    (12, binary(10, 99, 10, 99, "-")),
    (6, binary(100, 999, 100, 999, "+")),
    (10, binary(10, 99, 2, 9, "*")),
]


def split_of(prompt: str) -> str:
    """Assign a prompt to "train" or "eval" by a stable hash, so the splits never share a prompt."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") % 100
    return "eval" if bucket < EVAL_FRACTION_PERCENT else "train"


def generate(n: int, seed: int, split: str | None = None, kinds: Kinds = KINDS) -> list[dict]:
    """Draw `n` rows `{"prompt", "answer"}` deterministically from `seed`, from the mix `kinds`.

    With `split` set ("train" or "eval") only prompts hashed into that split are kept, which is how
    the bundled files stay disjoint. Prompts may repeat within a split (the 1-digit space is small);
    the answer is a decimal string, possibly negative.
    """
    if split not in (None, "train", "eval"):
        raise ValueError(f"split must be None, 'train' or 'eval', got {split!r}")
    rng = random.Random(seed)
    weights = [w for w, _ in kinds]
    samplers = [s for _, s in kinds]
    rows: list[dict] = []
    while len(rows) < n:
        sampler = rng.choices(samplers, weights=weights)[0]
        prompt, value = sampler(rng)
        if split is None or split_of(prompt) == split:
            rows.append({"prompt": prompt, "answer": str(value)})
    return rows


def bundled_splits() -> dict[str, list[dict]]:
    """The exact rows of the shipped train/eval files (tests compare the files against this)."""
    return {
        "train": generate(TRAIN_SIZE, TRAIN_SEED, split="train"),
        "eval": generate(EVAL_SIZE, EVAL_SEED, split="eval"),
    }


def write_jsonl(rows: list[dict], path: Path) -> None:
    """Write one compact JSON object per line (stable key order, trailing newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps({"prompt": row["prompt"], "answer": row["answer"]}) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    """Read a jsonl taskset back into a list of rows."""
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_splits_cli(
    argv: list[str] | None, prog: str, description: str, default_dir: Path, splits: Callable[[], dict]
) -> None:
    """The command line every bundled taskset generator shares: write `splits()` as `<name>.jsonl` files."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--out-dir", type=Path, default=default_dir, help="output directory (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    for name, rows in splits().items():
        path = args.out_dir / f"{name}.jsonl"
        write_jsonl(rows, path)
        print(f"wrote {len(rows)} rows to {path}")


def main(argv: list[str] | None = None) -> None:
    write_splits_cli(
        argv,
        "python -m pipelines.arith_tasks",
        "Write the bundled arithmetic tasksets (train.jsonl and eval.jsonl, rows with 'prompt' and "
        "'answer'). Output is deterministic; train and eval prompts never overlap.",
        ASSETS_DIR,
        bundled_splits,
    )


if __name__ == "__main__":
    main()
