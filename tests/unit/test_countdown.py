"""The countdown reward (safe equation checking) and the deterministic countdown taskset generator."""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

from operators.rollout.rewards import countdown, parse_equation
from pipelines.reference import countdown_tasks

TRUTH = json.dumps({"target": 24, "numbers": [3, 8, 1]})


def score(equation: str, truth: str = TRUTH) -> dict[str, float]:
    return countdown(f"Let me think. <answer>{equation}</answer>", truth)


@pytest.mark.parametrize("equation", ["3 * 8 * 1", "(3 * 8) / 1", " 1*8*3 ", "8 * (3 / 1)"])
def test_a_right_equation_scores_one(equation):
    assert score(equation) == {"reward": 1.0, "accuracy": 1.0, "format": 1.0}


def test_nesting_within_the_length_limit_is_fine():
    assert score("(" * 95 + "3 * 8 * 1" + ")" * 95)["reward"] == 1.0


def test_fractions_are_exact():
    truth = json.dumps({"target": 24, "numbers": [1, 3, 4, 6]})
    assert score("6 / (1 - 3 / 4)", truth)["reward"] == 1.0


@pytest.mark.parametrize(
    ("equation", "why"),
    [
        ("3 * 8", "a number left out"),
        ("3 * 8 * 1 * 1", "a number used twice"),
        ("3 * 8 * 1 + 0", "a number not given"),
        ("3 * 8 + 1", "wrong value"),
        ("24", "just the target"),
    ],
)
def test_a_parsable_but_wrong_equation_keeps_the_format_part(equation, why):
    assert score(equation) == {"reward": 0.0, "accuracy": 0.0, "format": 1.0}, why


@pytest.mark.parametrize(
    "equation",
    [
        "__import__('os').system('echo hi')",
        "9**9**9",
        "3 ** 8 * 1",
        "-3 * -8 * 1",
        "3.0 * 8 * 1",
        "3 * 8 * 1 = 24",
        "(3)(8)(1)",
        "3 // 1 * 8",
        "3 * 8 % 1",
        "",
        "1_0 + 3",
        "3 * 8 * ٣",
        "(" * 150 + "3" + ")" * 150,
        " + ".join(["1"] * 200),
    ],
    ids=[
        "import",
        "power-tower",
        "power",
        "unary-minus",
        "float",
        "equals-sign",
        "implicit-call",
        "floor-div",
        "modulo",
        "empty",
        "underscore-literal",
        "non-ascii-digit",
        "deep-nesting",
        "too-long",
    ],
)
def test_malformed_or_malicious_equations_score_zero_quickly(equation):
    started = time.process_time()  # CPU time: what scoring costs, not how busy the machine's other core is
    assert score(equation) == {"reward": 0.0, "accuracy": 0.0, "format": 0.0}
    assert time.process_time() - started < 1.0


def test_only_the_last_answer_tag_counts_and_a_tag_is_required():
    assert countdown("<answer>3 * 8 * 1</answer> hmm <answer>3 + 8 + 1</answer>", TRUTH)["reward"] == 0.0
    assert countdown("<answer>3 + 8</answer> no: <answer>3 * 8 * 1</answer>", TRUTH)["reward"] == 1.0
    assert countdown("3 * 8 * 1", TRUTH) == {"reward": 0.0, "accuracy": 0.0, "format": 0.0}


def test_division_by_zero_scores_zero():
    truth = json.dumps({"target": 3, "numbers": [3, 8, 8]})
    assert score("3 + 8 / (8 - 8)", truth) == {"reward": 0.0, "accuracy": 0.0, "format": 1.0}


def test_a_malformed_truth_is_a_taskset_error():
    with pytest.raises(ValueError, match="countdown truth must be JSON"):
        countdown("<answer>1</answer>", "24")


def test_parse_equation_accepts_only_arithmetic():
    assert ast.unparse(parse_equation(" (1 + 2) * 3 ")) == "(1 + 2) * 3"
    assert parse_equation("a + 1") is None
    assert parse_equation("1 +") is None


# --- generator --------------------------------------------------------------------------------------------


def test_generation_is_deterministic_and_distinct():
    first, again = countdown_tasks.generate(50, seed=3), countdown_tasks.generate(50, seed=3)
    assert first == again
    assert first != countdown_tasks.generate(50, seed=4)
    assert len({countdown_tasks.puzzle_of(row) for row in first}) == 50


def test_every_bundled_puzzle_is_solved_by_its_solution():
    splits = countdown_tasks.bundled_splits()
    assert (len(splits["train"]), len(splits["eval"])) == (
        countdown_tasks.TRAIN_SIZE,
        countdown_tasks.EVAL_SIZE,
    )
    for row in splits["train"] + splits["eval"]:
        spec = json.loads(row["answer"])
        assert countdown_tasks.TARGET_MIN <= spec["target"] <= countdown_tasks.TARGET_MAX
        assert len(spec["numbers"]) in countdown_tasks.NUMBER_COUNTS
        assert str(spec["numbers"]) in row["prompt"] and f"make {spec['target']}." in row["prompt"]
        assert countdown(f"<answer>{row['solution']}</answer>", row["answer"])["reward"] == 1.0, row


def test_train_and_eval_share_no_puzzle():
    splits = countdown_tasks.bundled_splits()
    train, eval_ = ({countdown_tasks.puzzle_of(r) for r in splits[name]} for name in ("train", "eval"))
    assert not train & eval_


def read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_bundled_files_equal_the_generator_output():
    for name, rows in countdown_tasks.bundled_splits().items():
        assert read_jsonl(countdown_tasks.ASSETS_DIR / f"{name}.jsonl") == rows, f"regenerate {name}.jsonl"


def test_cli_writes_the_requested_sizes(tmp_path, capsys):
    countdown_tasks.main(["--out-dir", str(tmp_path), "--train-size", "7", "--eval-size", "3", "--seed", "5"])
    assert [len(read_jsonl(tmp_path / f"{n}.jsonl")) for n in ("train", "eval")] == [7, 3]
    assert "wrote 7 rows" in capsys.readouterr().out
    assert read_jsonl(tmp_path / "train.jsonl") == countdown_tasks.generate(7, seed=5)
