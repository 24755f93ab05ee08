"""The bundled tiny model and arithmetic tasksets: reproducible, small, and in the format rftflow expects."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from pipelines.reference import arith_tasks, tiny_model

SHIPPED = tiny_model.default_model_dir()


@pytest.fixture(scope="module")
def short_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Three 5-step builds: seed 0 twice and seed 1 once (the full schedule is too slow for tests)."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        name: tiny_model.weights_hash(tiny_model.build_tiny_model(root / name, seed=seed, train_steps=5))
        for name, seed in [("a", 0), ("b", 0), ("c", 1)]
    }


def test_same_seed_rebuild_gives_same_weights(short_builds: dict[str, str]) -> None:
    assert short_builds["a"] == short_builds["b"]


def test_different_seed_gives_different_weights(short_builds: dict[str, str]) -> None:
    assert short_builds["a"] != short_builds["c"]


def test_build_restores_torch_settings(tmp_path: Path) -> None:
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    tiny_model.build_tiny_model(tmp_path / "m", seed=0, train_steps=1)
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == deterministic


def test_shipped_weights_match_build_info() -> None:
    info = json.loads((SHIPPED / "BUILD_INFO.json").read_text())
    assert tiny_model.weights_hash(SHIPPED) == info["weights_hash"]
    assert info["seed"] == 0 and info["train_steps"] == tiny_model.DEFAULT_TRAIN_STEPS


def test_shipped_dir_is_small() -> None:
    size = sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file())
    assert size <= 5 * 1024 * 1024


def test_shipped_config_fits_vllm_cpu() -> None:
    config = json.loads((SHIPPED / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["head_dim"] == config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["max_position_embeddings"] == 256
    generation = json.loads((SHIPPED / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"]


def test_tokenizer_digits_and_chat_template() -> None:
    tok = PreTrainedTokenizerFast.from_pretrained(SHIPPED)
    assert tok.convert_ids_to_tokens(tok("123", add_special_tokens=False)["input_ids"]) == ["1", "2", "3"]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "What is 2 + 3?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|bos|><|system|>S<|eos|><|user|>What is 2 + 3?<|eos|><|assistant|>"
    ids = tok.apply_chat_template(messages[1:], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.eos_token == "<|eos|>" and tok.pad_token == "<|pad|>"


def test_shipped_model_answers_in_format() -> None:
    tok = PreTrainedTokenizerFast.from_pretrained(SHIPPED)
    model = LlamaForCausalLM.from_pretrained(SHIPPED).eval()
    ids = torch.tensor([tiny_model.prompt_ids(tok, "What is 3 + 4?")])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=16
        )
    response = out[0, ids.shape[1] :].tolist()
    assert response[-1] == tok.eos_token_id
    assert re.fullmatch(r"<answer>-?\d+</answer>", tok.decode(response, skip_special_tokens=True))


def test_generate_is_deterministic_and_well_formed() -> None:
    rows = arith_tasks.generate(300, seed=5)
    assert rows == arith_tasks.generate(300, seed=5)
    assert rows != arith_tasks.generate(300, seed=6)
    for row in rows:
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", row["prompt"]).groups()
        assert row["answer"] == str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])


def test_bundled_tasksets_match_generator_and_are_disjoint() -> None:
    expected = arith_tasks.bundled_splits()
    for name, rows in expected.items():
        assert arith_tasks.read_jsonl(arith_tasks.ASSETS_DIR / f"{name}.jsonl") == rows
    assert len(expected["train"]) == arith_tasks.TRAIN_SIZE and len(expected["eval"]) == arith_tasks.EVAL_SIZE
    train_prompts = {row["prompt"] for row in expected["train"]}
    assert not train_prompts & {row["prompt"] for row in expected["eval"]}
    training_stream = tiny_model.arith_conversations(seed=0, count=6400)
    assert training_stream[: len(expected["train"])] == [
        tiny_model.arith_conversation(row) for row in expected["train"]
    ]
    assert all(arith_tasks.split_of(turns[0].content) == "train" for turns in training_stream)
