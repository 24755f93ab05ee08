"""The bundled tiny tool model and `tool_arith` tasksets: reproducible, small, speaking the `tool` role."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2
import pytest
from transformers import PreTrainedTokenizerFast

from operators.workflows.tool_math import CALL_CLOSE, CALL_OPEN, TOOL_SYSTEM_PROMPT
from pipelines.reference import arith_tasks, tiny_model, tool_arith_tasks
from pipelines.reference.tiny_tool_model import TOOL_RECIPE, conversations
from schemas.config import DEFAULT_MODEL, TOOL_MODEL


def test_shipped_tool_model_matches_its_build_info_and_is_small() -> None:
    info = json.loads((TOOL_MODEL / "BUILD_INFO.json").read_text())
    assert tiny_model.weights_hash(TOOL_MODEL) == info["weights_hash"]
    assert info["seed"] == 0 and info["train_steps"] == TOOL_RECIPE.train_steps
    assert {"tool_call_rate", "tool_math_reward", "arith_reward"} <= set(info["vllm_tool_figures"])
    assert sum(p.stat().st_size for p in TOOL_MODEL.rglob("*") if p.is_file()) <= 5 * 1024 * 1024
    assert tiny_model.default_model_dir(TOOL_RECIPE) == TOOL_MODEL


def test_the_tool_template_renders_all_four_roles_and_the_default_refuses_tool() -> None:
    messages = [
        {"role": "system", "content": TOOL_SYSTEM_PROMPT},
        {"role": "user", "content": "What is 47 * 83?"},
        {"role": "assistant", "content": "<calc>47 * 83</calc>"},
        {"role": "tool", "content": "3901"},
    ]
    tok = PreTrainedTokenizerFast.from_pretrained(TOOL_MODEL)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        f"<|bos|><|system|>{TOOL_SYSTEM_PROMPT}<|eos|><|user|>What is 47 * 83?<|eos|>"
        "<|assistant|><calc>47 * 83</calc><|eos|><|tool|>3901<|eos|><|assistant|>"
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=False) == text
    for token in ("<|tool|>", CALL_OPEN, CALL_CLOSE):
        assert len(tok(token, add_special_tokens=False)["input_ids"]) == 1
    default = PreTrainedTokenizerFast.from_pretrained(DEFAULT_MODEL)
    with pytest.raises(jinja2.TemplateError, match="unsupported role: tool"):
        default.apply_chat_template(messages, tokenize=False)


def test_the_default_models_ids_are_kept_by_the_tool_tokenizer() -> None:
    default = PreTrainedTokenizerFast.from_pretrained(DEFAULT_MODEL)
    tool = PreTrainedTokenizerFast.from_pretrained(TOOL_MODEL)
    assert {k: v for k, v in tool.get_vocab().items() if k in default.get_vocab()} == default.get_vocab()


def test_tool_arith_generator_is_deterministic_and_the_bundled_files_match() -> None:
    rows = tool_arith_tasks.generate(300, seed=5)
    assert rows == tool_arith_tasks.generate(300, seed=5) and rows != tool_arith_tasks.generate(300, seed=6)
    for row in rows:
        a, b = map(int, re.fullmatch(r"What is (\d\d) \* (\d\d)\?", row["prompt"]).groups())
        assert row["answer"] == str(a * b)
    expected = tool_arith_tasks.bundled_splits()
    for name, bundled in expected.items():
        assert arith_tasks.read_jsonl(tool_arith_tasks.ASSETS_DIR / f"{name}.jsonl") == bundled
    assert len(expected["train"]) == tool_arith_tasks.TRAIN_SIZE
    assert len(expected["eval"]) == tool_arith_tasks.EVAL_SIZE
    four = expected["train_4digit"]
    assert four == [r for r in expected["train"] if int(r["answer"]) >= 1000] and len(four) > 1500
    assert not {r["prompt"] for r in expected["train"]} & {r["prompt"] for r in expected["eval"]}


def test_the_tool_training_stream_is_deterministic_and_from_train_splits_only() -> None:
    stream = conversations(0, 600)
    assert stream == conversations(0, 600) and stream != conversations(1, 600)
    prompts = [turn.content for turns in stream for turn in turns if turn.role == "user"]
    assert all(arith_tasks.split_of(prompt) == "train" for prompt in prompts)
    system = [turns for turns in stream if turns[0].role == "system"]
    assert all(turns[0].content == TOOL_SYSTEM_PROMPT for turns in system)
    calls = [turns for turns in system if turns[2].content.startswith(CALL_OPEN)]
    drills = [turns for turns in calls if turns[2].given]
    assert 0 < len(drills) < len(calls) < len(system)  # decisions both ways, and drills
    assert all(turns[4].content == f"<answer>{turns[3].content}</answer>" for turns in calls)


@pytest.mark.timeout(120)
def test_short_tool_builds_from_the_default_model_are_deterministic(tmp_path: Path) -> None:
    hashes = [
        tiny_model.weights_hash(tiny_model.build_tiny_model(tmp_path / str(i), 0, 2, TOOL_RECIPE))
        for i in range(2)
    ]
    assert hashes[0] == hashes[1]
