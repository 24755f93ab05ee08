"""Prompts longer than `max_prompt_tokens`, up to a 10 MB taskset line: refused at once (no retry) or cut to
their last tokens, as `prompt_overflow` says, on the real in-process engine.

Tokenizing 10 MB takes 15-25 s with the bundled tokenizer on 2 cores, so the engine refuses a prompt whose
length alone proves it too long before tokenizing it (operators/prompt_bound.py). The first tests check that
this early refusal is sound: it is offered only for tokenizers where one token covers a bounded run of bytes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer

from operators.engine.client import EngineClient
from operators.engine.prompt_bound import max_token_bytes, refuse_by_length
from operators.rollout.operator import RolloutOperator
from operators.tasks.reader import iter_task_tables, plan_taskset, read_units
from schemas.config import DEFAULT_MODEL, RolloutArgs, TasksetConfig
from schemas.errors import TaskInputError

LONGEST_TOKEN = len("<|assistant|>")  # the bundled tokenizer's longest token, in bytes
LIMIT = 200  # max_prompt_tokens in the engine tests (max_model_len is 256)


def bundled_spec() -> dict:
    return json.loads((DEFAULT_MODEL / "tokenizer.json").read_text())


def tokenizer_from(spec: dict) -> SimpleNamespace:
    """A stand-in with only what max_token_bytes reads: a real `tokenizers.Tokenizer` as backend."""
    return SimpleNamespace(backend_tokenizer=Tokenizer.from_str(json.dumps(spec)))


# -- the early refusal is sound ------------------------------------------------------------------------------


def test_the_bundled_tokenizer_never_packs_more_bytes_into_a_token_than_its_bound():
    tokenizer = AutoTokenizer.from_pretrained(str(DEFAULT_MODEL))
    assert max_token_bytes(tokenizer) == LONGEST_TOKEN
    texts = [
        "<|assistant|>" * 500,
        "<|bos|><|user|><|eos|>" * 300,
        " " * 5000,
        "9" * 5000,
        "a" * 5000,
        "What is 12 + 34? " * 300,
        "é€😀\u0301\x00\n\t" * 500,
        "".join(chr(c) for c in range(32, 0x3000, 7)),
    ]
    for text in texts:
        tokens = len(tokenizer.encode(text, add_special_tokens=False))
        assert tokens * LONGEST_TOKEN >= len(text.encode()), text[:30]


def wordpiece() -> SimpleNamespace:
    model = models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]", max_input_chars_per_word=100)
    return SimpleNamespace(backend_tokenizer=Tokenizer(model))


def test_wordpiece_covers_unbounded_text_with_one_token_so_gets_no_bound():
    assert len(wordpiece().backend_tokenizer.encode("b" * 10_000).ids) == 1  # one [UNK] for 10 kB
    assert max_token_bytes(wordpiece()) is None


def with_normalizer(spec: dict) -> None:
    spec["normalizer"] = {"type": "NFC"}


def with_whitespace_split(spec: dict) -> None:
    spec["pre_tokenizer"] = {"type": "Whitespace"}  # drops the whitespace it splits on


def with_removing_split(spec: dict) -> None:
    split = {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False}
    spec["pre_tokenizer"]["pretokenizers"].append(split)


def with_stripping_added_token(spec: dict) -> None:
    spec["added_tokens"][1]["rstrip"] = True  # <|eos|> would swallow any run of spaces after it


def without_byte_level(spec: dict) -> None:
    spec["pre_tokenizer"] = {"type": "Digits", "individual_digits": True}


def with_a_byte_missing(spec: dict) -> None:
    del spec["model"]["vocab"][pre_tokenizers.ByteLevel.alphabet()[0]]


@pytest.mark.parametrize(
    "change",
    [
        with_normalizer,
        with_whitespace_split,
        with_removing_split,
        with_stripping_added_token,
        without_byte_level,
        with_a_byte_missing,
    ],
)
def test_any_part_that_can_drop_or_fuse_text_voids_the_bound(change):
    spec = bundled_spec()
    assert max_token_bytes(tokenizer_from(spec)) == LONGEST_TOKEN
    change(spec)
    assert (
        max_token_bytes(SimpleNamespace(backend_tokenizer=SimpleNamespace(to_str=lambda: json.dumps(spec))))
        is None
    )


def test_refuse_by_length_refuses_only_what_its_length_proves():
    refuse_by_length("x" * 10 * LONGEST_TOKEN, 10, LONGEST_TOKEN)  # could be 10 tokens: left to the tokenizer
    refuse_by_length("x" * 10**6, None, LONGEST_TOKEN)
    refuse_by_length("x" * 10**6, 10, None)
    with pytest.raises(
        TaskInputError, match=r"at least 11 tokens \(131 characters, at most 13 bytes a token\)"
    ):
        refuse_by_length("x" * 131, 10, LONGEST_TOKEN)


# -- on the engine -------------------------------------------------------------------------------------------


def task_table(tmp_path: Path, prompt: str) -> pa.Table:
    """A short task and the long one, as the taskset reader streams them (the long line read whole)."""
    path = tmp_path / "t.jsonl"
    rows = [{"prompt": "What is 3 + 4?", "answer": "7"}, {"prompt": prompt, "answer": "2"}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = TasksetConfig(path=path, repeat_times=2, rollout_args=RolloutArgs(max_tokens=8))
    plan = plan_taskset(cfg, 2, 1, None)
    return pa.concat_tables(
        block for unit in read_units(plan) for block in iter_task_tables(cfg, plan, *unit)
    )


def run_tasks(loop, engine, tasks: pa.Table) -> dict[int, dict]:
    """Each task's result row, by the task's index in the taskset."""
    client = EngineClient(engine, name="local")
    rollout = RolloutOperator.from_clients([client], max_timeout=300.0, max_retry_times=2)
    results = loop.run_until_complete(rollout(tasks)).to_pylist()
    return {int(row["task_uid"].rsplit("/", 1)[1]): row for row in results}


@pytest.fixture
def limited(engine):
    saved = engine.prompts.max_prompt_tokens, engine.prompts.prompt_overflow
    engine.prompts.max_prompt_tokens = LIMIT
    yield engine
    engine.prompts.max_prompt_tokens, engine.prompts.prompt_overflow = saved


def test_a_10_mb_prompt_is_refused_at_once_and_untokenized(loop, limited, tmp_path):
    limited.prompts.prompt_overflow = "refuse"
    assert limited.prompts.token_bytes == LONGEST_TOKEN  # found on vLLM's own tokenizer
    tasks = task_table(tmp_path, "What is 1 + 1? " * (10_000_000 // 15))
    short, long = run_tasks(loop, limited, tasks).values()
    assert short["ok"] and len(short["experiences"]) == 2
    assert (long["ok"], long["attempts"], long["experiences"]) == (False, 1, [])  # failed at once, unretried
    # "at least": refused by its length (prompt_bound), untokenized; the tokenizer would give an exact count
    at_least = int(re.search(r"prompt has at least (\d+) tokens", long["message"]).group(1))
    assert (
        at_least >= 10_000_000 // LONGEST_TOKEN and f"more than max_prompt_tokens={LIMIT}" in long["message"]
    )


def test_with_no_max_prompt_tokens_a_2_mib_prompt_is_refused_by_what_max_model_len_leaves(
    loop, engine, tmp_path
):
    """The default limit is max_model_len (256 here) minus the request's max_tokens (8): refused at once,
    untokenized and unretried, where vLLM would have rejected it only after tokenizing and queueing it."""
    assert engine.prompts.max_prompt_tokens is None and engine.prompts.prompt_overflow == "refuse"
    short, long = run_tasks(
        loop, engine, task_table(tmp_path, "What is 1 + 1? " * (2 * 2**20 // 15))
    ).values()
    assert short["ok"] and (long["ok"], long["attempts"], long["experiences"]) == (False, 1, [])
    assert "prompt has at least" in long["message"] and "max_model_len - max_tokens=248" in long["message"]


def test_a_1_mib_prompt_is_cut_to_its_last_tokens(loop, limited, tmp_path):
    """Truncation has to tokenize it all (here ~2 s a MiB), so it uses a smaller prompt than refusal."""
    limited.prompts.prompt_overflow = "truncate"
    short, long = run_tasks(loop, limited, task_table(tmp_path, "What is 1 + 1? " * (2**20 // 15))).values()
    assert short["ok"] and long["ok"]
    assert [len(e["prompt_ids"]) for e in long["experiences"]] == [LIMIT, LIMIT]
    # the question's end and the generation prompt, which the chat template puts last
    assert all(e["prompt_text"].endswith("1 + 1? <|eos|><|assistant|>") for e in long["experiences"])
