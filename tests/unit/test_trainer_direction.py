"""One reference-trainer update on the real bundled model, in the direction its advantages say.

The batch: four arithmetic tasks from the bundled train set, each with its right answer (reward 1) and the
base model's most likely near miss (reward 0), both plausible to it (logprob about -2 to -3), the sampled
logprobs the model's own. Deterministic: CPU, one thread, fixed data; no Ray, no vLLM.

- A gradient step (`train_on_experiences` under SGD) raises every right answer's logprob and lowers every
  wrong one's, whether the advantages come from the explorer or are computed by the trainer.
- The shipped default (AdamW at lr 2e-4, a fresh optimizer) raises the advantage-weighted objective and
  lowers every wrong answer, but lowers the right answers too: Adam's first steps are sign steps of size lr
  on every weight, which on this 0.5M-parameter model outweigh the gradient's own direction. Measured here
  as a strict xfail, a finding of issue #16 (why the demo's reward does not rise).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from unit_factories import make_experience

from pipelines.reference.grpo import (
    GRPOConfig,
    make_batch,
    make_optimizer,
    token_logprobs,
    train_on_experiences,
)
from schemas.config import DEFAULT_MODEL
from schemas.experience import experiences_to_table

# (question, right answer, the base model's likeliest answer among right +-1, +-2, +-10): rows 14, 23, 32
# and 39 of arith/train.jsonl. The model answers `<answer>N</answer>` then end of sequence.
TASKS = [
    ("What is 52 + 41?", 93, 95),
    ("What is 94 + 43?", 137, 136),
    ("What is 57 + 31?", 88, 89),
    ("What is 71 + 36?", 107, 106),
]


@pytest.fixture(scope="module")
def tokenizer():
    """The model's tokenizer, with torch on one thread meanwhile (summation order fixed), then restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    torch.set_num_threads(threads)


def load_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32).eval()


def encode(tokenizer, question: str, answer: int) -> tuple[list[int], list[int]]:
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(f"<answer>{answer}</answer>", add_special_tokens=False)["input_ids"]
    return prompt_ids, [*response_ids, tokenizer.eos_token_id]


def model_logprobs(model, pairs: list[tuple[list[int], list[int]]], pad_id: int) -> list[list[float]]:
    """Each response token's logprob under `model`, as an engine records them at sampling."""
    input_ids, attention_mask, response_mask = make_batch(
        [p for p, _ in pairs], [r for _, r in pairs], pad_id
    )
    with torch.no_grad():
        logprobs = token_logprobs(model, input_ids, attention_mask)
    return [row[mask.bool()].tolist() for row, mask in zip(logprobs, response_mask, strict=True)]


def sequence_logprobs(model, pairs: list[tuple[list[int], list[int]]], pad_id: int) -> list[float]:
    """Each response's summed logprob under `model`."""
    return [sum(lps) for lps in model_logprobs(model, pairs, pad_id)]


def experiences(model, tokenizer, advantage: bool) -> tuple[pa.Table, list[float]]:
    """Per task a right (reward 1) and a wrong (reward 0) response with the model's own logprobs; with
    `advantage`, the explorer's +1 / -1 written in, else left for the trainer to compute."""
    pairs, rows = [], []
    for index, (question, right, wrong) in enumerate(TASKS):
        for run, (answer, reward) in enumerate([(right, 1.0), (wrong, 0.0)]):
            pairs.append(encode(tokenizer, question, answer))
            rows.append((f"arith/e0/{index}", run, reward))
    own = model_logprobs(model, pairs, tokenizer.pad_token_id)
    table = experiences_to_table(
        [
            make_experience(
                task,
                run,
                prompt_ids=prompt,
                response_ids=response,
                logprobs=own[i],
                reward=reward,
                advantage=(1.0 if reward else -1.0) if advantage else None,
            )
            for i, ((task, run, reward), (prompt, response)) in enumerate(zip(rows, pairs, strict=True))
        ]
    )
    return table, sequence_logprobs(model, pairs, tokenizer.pad_token_id)


def update(tokenizer, optimizer: str, from_explorer: bool = True) -> tuple[list[float], dict[str, float]]:
    """One update on the batch; returns each response's logprob change (right, wrong, right, ...) and the
    trainer's metrics."""
    model = load_model()
    table, before = experiences(model, tokenizer, from_explorer)
    if optimizer == "sgd":
        cfg = GRPOConfig(lr=1e-2)
        optim = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    else:
        cfg = GRPOConfig()  # the reference trainer's defaults: AdamW, lr 2e-4
        optim = make_optimizer(model, cfg)
    metrics = train_on_experiences(model, optim, table, cfg, tokenizer.pad_token_id, reference=load_model())
    pairs = [encode(tokenizer, q, a) for q, right, wrong in TASKS for a in (right, wrong)]
    after = sequence_logprobs(model, pairs, tokenizer.pad_token_id)
    return [b - a for a, b in zip(before, after, strict=True)], metrics


@pytest.mark.parametrize("from_explorer", [True, False], ids=["explorer-advantage", "trainer-advantage"])
def test_a_gradient_step_raises_each_right_answer_and_lowers_each_wrong_one(tokenizer, from_explorer):
    moved, metrics = update(tokenizer, "sgd", from_explorer)
    assert metrics["train/samples"] == 8.0 and metrics["train/zero_adv_groups"] == 0.0
    assert metrics["train/kl_to_start"] == pytest.approx(0.0, abs=1e-6)  # measured before the update
    assert all(m > 0 for m in moved[0::2]), moved  # positive advantage
    assert all(m < 0 for m in moved[1::2]), moved  # negative advantage


def test_the_default_update_raises_the_objective_and_lowers_every_wrong_answer(tokenizer):
    moved, _ = update(tokenizer, "adamw")
    lengths = [
        len(r) for q, right, wrong in TASKS for _, r in (encode(tokenizer, q, a) for a in (right, wrong))
    ]
    # the loss averages each response's tokens: its gain is the advantage-weighted per-token change
    gain = sum((1 if i % 2 == 0 else -1) * m / n for i, (m, n) in enumerate(zip(moved, lengths, strict=True)))
    assert gain > 0
    assert all(m < 0 for m in moved[1::2]), moved


@pytest.mark.xfail(
    strict=True,
    reason="issue #16: AdamW's first step at lr 2e-4 lowers the right answers too (mean -0.036 nats here)",
)
def test_the_default_update_raises_the_right_answers(tokenizer):
    moved, _ = update(tokenizer, "adamw")
    assert sum(moved[0::2]) > 0, moved
