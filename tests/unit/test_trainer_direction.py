"""One reference-trainer update on the real bundled models, in the direction its advantages say.

Two batches of four tasks, each task with a response to reinforce (advantage +1) and one to discourage (-1),
the sampled logprobs the model's own. Deterministic: CPU, one thread, fixed data; no Ray, no vLLM.
- Arithmetic, on the default model: each task's right answer against the base model's likeliest near miss,
  both plausible to it (logprob about -2 to -3).
- The demo's decision, on the tool model: a calculator call against a direct (wrong) answer.

- A gradient step (`train_on_experiences` under SGD) raises every positive response's logprob and lowers every
  negative one's, on both, whether the advantages come from the explorer or are computed by the trainer.
- The shipped default (AdamW at lr 2e-4, a fresh optimizer) moves the tool decision the right way for every
  task from the first step: that is what `make demo` learns.
- On arithmetic the default raises the advantage-weighted objective and lowers every wrong answer, but lowers
  the right answers too: Adam's first steps are sign steps of size lr on every weight, which on this
  0.5M-parameter model outweigh the gradient's own direction when the two responses differ by a digit.
  Measured as a strict xfail, a finding of issue #16 (why the arithmetic demo's reward does not rise).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from unit_factories import make_experience

from operators.workflows.tool_math import TOOL_SYSTEM_PROMPT
from pipelines.reference.grpo import (
    GRPOConfig,
    make_batch,
    make_optimizer,
    token_logprobs,
    train_on_experiences,
)
from schemas.config import DEFAULT_MODEL, TOOL_MODEL
from schemas.experience import experiences_to_table


@dataclass(frozen=True)
class Case:
    """A model and, per task, the response to reinforce (advantage +1) and the one to discourage (-1)."""

    model: Path
    system: str | None
    tasks: list[tuple[str, str, str]]  # (question, positive response, negative response)


# rows 14, 23, 32 and 39 of arith/train.jsonl: the right answer, and the base model's likeliest answer among
# right +-1, +-2, +-10. The model answers `<answer>N</answer>` then end of sequence.
ARITH = Case(
    DEFAULT_MODEL,
    None,
    [
        ("What is 52 + 41?", "<answer>93</answer>", "<answer>95</answer>"),
        ("What is 94 + 43?", "<answer>137</answer>", "<answer>136</answer>"),
        ("What is 57 + 31?", "<answer>88</answer>", "<answer>89</answer>"),
        ("What is 71 + 36?", "<answer>107</answer>", "<answer>106</answer>"),
    ],
)
# rows 0, 1, 3 and 4 of tool_arith/train.jsonl: the demo's decision, a calculator call (the first reply of a
# run the tool answers right) against a direct answer as the tool model samples them (always wrong).
TOOL = Case(
    TOOL_MODEL,
    TOOL_SYSTEM_PROMPT,
    [
        ("What is 75 * 72?", "<calc>75 * 72</calc>", "<answer>5809</answer>"),
        ("What is 37 * 74?", "<calc>37 * 74</calc>", "<answer>2538</answer>"),
        ("What is 42 * 78?", "<calc>42 * 78</calc>", "<answer>3256</answer>"),
        ("What is 81 * 22?", "<calc>81 * 22</calc>", "<answer>1702</answer>"),
    ],
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Torch on one thread meanwhile (summation order fixed), then restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def load_model(case: Case) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(case.model, dtype=torch.float32).eval()


def encode(tokenizer, case: Case, question: str, response: str) -> tuple[list[int], list[int]]:
    system = [] if case.system is None else [{"role": "system", "content": case.system}]
    prompt = tokenizer.apply_chat_template(
        [*system, {"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
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


def all_pairs(tokenizer, case: Case) -> list[tuple[list[int], list[int]]]:
    """Per task the positive, then the negative response, encoded."""
    return [encode(tokenizer, case, q, r) for q, good, bad in case.tasks for r in (good, bad)]


def experiences(model, tokenizer, case: Case, advantage: bool) -> tuple[pa.Table, list[float]]:
    """Per task the positive (reward 1) and the negative (reward 0) response with the model's own logprobs;
    with `advantage`, the explorer's +1 / -1 written in, else left for the trainer to compute."""
    pairs = all_pairs(tokenizer, case)
    own = model_logprobs(model, pairs, tokenizer.pad_token_id)
    table = experiences_to_table(
        [
            make_experience(
                f"t/e0/{i // 2}",
                i % 2,
                prompt_ids=prompt,
                response_ids=response,
                logprobs=own[i],
                reward=1.0 - i % 2,
                advantage=(1.0 - 2 * (i % 2)) if advantage else None,
            )
            for i, (prompt, response) in enumerate(pairs)
        ]
    )
    return table, sequence_logprobs(model, pairs, tokenizer.pad_token_id)


def update(case: Case, optimizer: str, from_explorer: bool = True) -> tuple[list[float], dict[str, float]]:
    """One update on the batch; returns each response's logprob change (positive, negative, positive, ...)
    and the trainer's metrics."""
    tokenizer = AutoTokenizer.from_pretrained(case.model)
    model = load_model(case)
    table, before = experiences(model, tokenizer, case, from_explorer)
    if optimizer == "sgd":
        cfg = GRPOConfig(lr=1e-2)
        optim = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    else:
        cfg = GRPOConfig()  # the reference trainer's defaults: AdamW, lr 2e-4
        optim = make_optimizer(model, cfg)
    metrics = train_on_experiences(
        model, optim, table, cfg, tokenizer.pad_token_id, reference=load_model(case)
    )
    after = sequence_logprobs(model, all_pairs(tokenizer, case), tokenizer.pad_token_id)
    return [b - a for a, b in zip(before, after, strict=True)], metrics


@pytest.mark.parametrize("from_explorer", [True, False], ids=["explorer-advantage", "trainer-advantage"])
@pytest.mark.parametrize("case", [ARITH, TOOL], ids=["arith", "tool"])
def test_a_gradient_step_raises_each_positive_response_and_lowers_each_negative_one(case, from_explorer):
    moved, metrics = update(case, "sgd", from_explorer)
    assert metrics["train/samples"] == 8.0 and metrics["train/zero_adv_groups"] == 0.0
    assert metrics["train/kl_to_start"] == pytest.approx(0.0, abs=1e-6)  # measured before the update
    assert all(m > 0 for m in moved[0::2]), moved  # positive advantage
    assert all(m < 0 for m in moved[1::2]), moved  # negative advantage


def test_the_default_update_raises_the_objective_and_lowers_every_wrong_answer():
    moved, _ = update(ARITH, "adamw")
    tokenizer = AutoTokenizer.from_pretrained(ARITH.model)
    lengths = [len(r) for _, r in all_pairs(tokenizer, ARITH)]
    # the loss averages each response's tokens: its gain is the advantage-weighted per-token change
    gain = sum((1 if i % 2 == 0 else -1) * m / n for i, (m, n) in enumerate(zip(moved, lengths, strict=True)))
    assert gain > 0
    assert all(m < 0 for m in moved[1::2]), moved


@pytest.mark.xfail(
    strict=True,
    reason="issue #16: AdamW's first step at lr 2e-4 lowers the right answers too (mean -0.036 nats here)",
)
def test_the_default_update_raises_the_right_answers():
    moved, _ = update(ARITH, "adamw")
    assert sum(moved[0::2]) > 0, moved


def test_the_default_update_raises_every_calculator_call_and_lowers_every_direct_answer():
    """The demo's decision moves the right way at the trainer's defaults, from the first step."""
    moved, _ = update(TOOL, "adamw")
    assert all(m > 0 for m in moved[0::2]), moved
    assert all(m < 0 for m in moved[1::2]), moved
