"""The bundled curriculum taskset: the first 400 rows of the arithmetic taskset, each with two prior pass
rates (`weak_pass`, `strong_pass`) that `difficulty_based` reads as its `feature_keys`.

The priors are a rule of thumb by the operands' size (1-digit sums are easy, 3-digit ones hard), standing in
for the pass rates a weak and a strong reference model would measure.

    python -m pipelines.reference.graded_tasks    # rewrite pipelines/assets/tasksets/arith_graded/train.jsonl
"""

from __future__ import annotations

import json
import re

from pipelines.reference.arith_tasks import ASSETS_DIR, TRAIN_SEED, TRAIN_SIZE, generate

GRADED_FILE = ASSETS_DIR.parent / "arith_graded" / "train.jsonl"
ROWS = 400
PRIORS = {1: (0.6, 0.95), 2: (0.2, 0.7), 3: (0.05, 0.3)}  # digits of the largest operand -> (weak, strong)


def graded_rows() -> list[dict]:
    rows = generate(TRAIN_SIZE, TRAIN_SEED, split="train")[:ROWS]
    out = []
    for row in rows:
        digits = max(len(n) for n in re.findall(r"\d+", row["prompt"]))
        weak, strong = PRIORS.get(digits, (0.0, 0.1))
        out.append({**row, "weak_pass": weak, "strong_pass": strong})
    return out


def main() -> None:
    GRADED_FILE.parent.mkdir(parents=True, exist_ok=True)
    with GRADED_FILE.open("w", encoding="utf-8") as fh:
        for row in graded_rows():
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
