"""Deterministic `tool_arith` tasksets: products the tiny model cannot work out in its head.

Every row is two-digit times two-digit (`What is 47 * 83?`), a kind the arithmetic taskset never holds, so
the tool model's direct answers are mostly wrong while a `<calc>` call gets them right: the `tool_math`
reward then depends on the decision to call the calculator. The rows are drawn by `arith_tasks.generate` and
split by the same prompt hash, so train and eval never share a prompt.

`train_4digit` is the train rows whose product has four digits. The function-calling demo trains on it:
tiny-fc-llama copies a tool result into its answer by position and gets most three-digit ones wrong even
when it calls, so those rows reward the decision to call only now and then and mostly add noise.
"""

from __future__ import annotations

from pipelines.reference import arith_tasks

ASSETS_DIR = arith_tasks.ASSETS_DIR.parent / "tool_arith"
TRAIN_SIZE, TRAIN_SEED = 2000, 0
EVAL_SIZE, EVAL_SEED = 200, 1
KINDS: arith_tasks.Kinds = [(100, arith_tasks.binary(10, 99, 10, 99, "*"))]


def generate(n: int, seed: int, split: str | None = None) -> list[dict]:
    """`n` rows `{"prompt", "answer"}` drawn from `seed`; `split` keeps only that hash partition."""
    return arith_tasks.generate(n, seed, split, kinds=KINDS)


def bundled_splits() -> dict[str, list[dict]]:
    """The exact rows of the shipped train/eval files (tests compare the files against this)."""
    train = generate(TRAIN_SIZE, TRAIN_SEED, split="train")
    return {
        "train": train,
        "train_4digit": [row for row in train if len(row["answer"]) == 4],
        "eval": generate(EVAL_SIZE, EVAL_SEED, split="eval"),
    }


def main(argv: list[str] | None = None) -> None:
    arith_tasks.write_splits_cli(
        argv,
        "python -m pipelines.tool_arith_tasks",
        "Write the bundled tool_arith tasksets (train.jsonl, its four-digit products train_4digit.jsonl, "
        "and eval.jsonl: two-digit times two-digit products, rows with 'prompt' and 'answer'). "
        "Deterministic; train and eval prompts never overlap.",
        ASSETS_DIR,
        bundled_splits,
    )


if __name__ == "__main__":
    main()
