"""Build the tiny default model that ships with rftflow.

rftflow needs a policy that loads in vLLM CPU in seconds and is *partly* right on the bundled
arithmetic tasks, so RL has reward signal without any download. This module trains a 2-layer Llama
(plus a digit-level byte BPE tokenizer with a chat template) on train-split prompts only, just long
enough that temperature-1.0 accuracy lands mid-range (about 0.55 train / 0.42 eval). Everything is
seeded and single-threaded so a rebuild with the same seed reproduces the same weights, checked by
`weights_hash`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from operators.engine.checkpoints import weights_hash  # noqa: E402
from pipelines.reference import arith_tasks  # noqa: E402
from schemas.atomic import atomic_write_text  # noqa: E402
from schemas.run_dir import BUILD_INFO  # noqa: E402

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLE_TOKENS.values()]
VOCAB_SIZE = 320  # an upper bound: the small corpus runs out of merges first (277 tokens today)
DEFAULT_TRAIN_STEPS = 1500
BATCH_SIZE = 64
PEAK_LR = 3e-3
WARMUP_STEPS = 50
MAX_NEW_TOKENS = 24

# Each turn is "<|role|>content<|eos|>"; eos doubles as end-of-turn so vLLM stops after the answer.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # head_dim 64: a size vLLM's CPU attention kernels support
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def default_model_dir() -> Path:
    """The model directory shipped in the repo, so callers need no download or build step."""
    return Path(__file__).resolve().parent.parent / "assets" / "tiny-arith-llama"


def format_response(answer: str) -> str:
    """The exact assistant text the model is taught to emit (eos is appended separately)."""
    return f"<answer>{answer}</answer>"


def extract_answer(text: str) -> str | None:
    """Text inside the first `<answer>...</answer>`, or None when the model broke the format."""
    match = _ANSWER_RE.search(text)
    return match.group(1).strip() if match else None


def build_tokenizer(rows: list[dict]) -> PreTrainedTokenizerFast:
    """Train a small byte-level BPE on the taskset texts; digits stay single tokens for arithmetic."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [row["prompt"] for row in rows] + [format_response(row["answer"]) for row in rows]
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def prompt_ids(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    """Token ids of the chat-formatted user turn plus the assistant header (what vLLM will see)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _encode_examples(
    tokenizer: PreTrainedTokenizerFast, rows: list[dict]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask and labels masked to the response tokens only."""
    prompt_cache: dict[str, list[int]] = {}  # the stream repeats prompts; templating is the slow part
    eos = [tokenizer.eos_token_id]
    responses = tokenizer([format_response(row["answer"]) for row in rows], add_special_tokens=False)
    seqs: list[tuple[list[int], list[int]]] = []
    for row, response in zip(rows, responses["input_ids"], strict=True):
        if row["prompt"] not in prompt_cache:
            prompt_cache[row["prompt"]] = prompt_ids(tokenizer, row["prompt"])
        seqs.append((prompt_cache[row["prompt"]], response + eos))
    width = max(len(p) + len(r) for p, r in seqs)
    ids, mask, labels = [], [], []
    for prompt, response in seqs:
        pad = width - len(prompt) - len(response)
        ids.append(prompt + response + [tokenizer.pad_token_id] * pad)
        mask.append([1] * (len(prompt) + len(response)) + [0] * pad)
        labels.append([-100] * len(prompt) + response + [-100] * pad)
    return torch.tensor(ids), torch.tensor(mask), torch.tensor(labels)


@contextlib.contextmanager
def _deterministic_torch(seed: int) -> Iterator[None]:
    """Pin seed, algorithms and thread count for the build, then restore the caller's settings."""
    threads = torch.get_num_threads()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(threads)


def _lr_at(step: int, total: int) -> float:
    """Linear warmup then cosine decay to 10% of peak: stable for a tiny model at a high lr."""
    warmup = min(WARMUP_STEPS, max(1, total // 10))
    if step < warmup:
        return PEAK_LR * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def training_rows(seed: int, steps: int) -> list[dict]:
    """One fresh train-split row per example: `generate(steps * BATCH_SIZE, seed, split="train")`.

    A stream rather than epochs over train.jsonl, so the model learns arithmetic instead of
    memorising 2000 rows (which left eval accuracy far below train). Every row comes from the
    train hash partition, so no eval prompt is ever trained on; for seed 0 the stream starts with
    exactly the rows of the bundled train.jsonl.
    """
    return arith_tasks.generate(steps * BATCH_SIZE, seed, split="train")


def _train(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, rows: list[dict], steps: int) -> None:
    """Supervised fine-tuning on response tokens, consuming `rows` in order, BATCH_SIZE per step."""
    ids, mask, labels = _encode_examples(tokenizer, rows)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.98), weight_decay=0.01)
    model.train()
    started = time.monotonic()
    for step in range(steps):
        batch = slice(step * BATCH_SIZE, (step + 1) * BATCH_SIZE)
        width = int(mask[batch].sum(dim=1).max())
        out = model(
            input_ids=ids[batch, :width], attention_mask=mask[batch, :width], labels=labels[batch, :width]
        )
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, steps)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            elapsed = time.monotonic() - started
            print(f"step {step + 1}/{steps} loss {out.loss.item():.4f} ({elapsed:.0f}s)", flush=True)
    model.eval()


def build_tiny_model(out_dir: Path, seed: int = 0, train_steps: int | None = None) -> Path:
    """Train and save the tokenizer + model into `out_dir` (replaced if present) and return it.

    `train_steps=None` runs the default schedule that the calibration in BUILD_INFO.json refers to;
    a small value is for fast determinism tests. Training uses only the bundled train split.
    """
    steps = DEFAULT_TRAIN_STEPS if train_steps is None else train_steps
    out_dir = Path(out_dir)
    with _deterministic_torch(seed):
        tokenizer = build_tokenizer(arith_tasks.bundled_splits()["train"])
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            dtype="float32",
            **MODEL_SHAPE,
        )
        model = LlamaForCausalLM(config)
        _train(model, tokenizer, training_rows(seed, steps), steps)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=MAX_NEW_TOKENS,
    )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@torch.inference_mode()
def sampled_accuracy(model_dir: Path, rows: list[dict], samples: int = 1, seed: int = 0) -> float:
    """Mean exact-answer accuracy of temperature-1.0 samples, a vLLM-free calibration estimate."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir).eval()
    tokenizer.padding_side = "left"
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=MAX_NEW_TOKENS,
        num_return_sequences=samples,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], add_generation_prompt=True, tokenize=False
        )
        for row in rows
    ]
    torch.manual_seed(seed)
    correct = total = 0
    for start in range(0, len(rows), 256):
        chunk = prompts[start : start + 256]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**enc, generation_config=config)
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        for i, text in enumerate(texts):
            truth = rows[start + i // samples]["answer"]
            correct += extract_answer(text) == truth
            total += 1
    return correct / total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.tiny_model",
        description=(
            "Train the tiny Llama + digit BPE tokenizer on the bundled arithmetic train split and save it "
            "(safetensors, chat template, generation config). Deterministic for a given seed and step "
            "count; prints the final weights hash. Also writes BUILD_INFO.json with a sampled accuracy."
        ),
    )
    parser.add_argument(
        "--out", type=Path, default=default_model_dir(), help="output dir (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for init and data order (default: %(default)s)"
    )
    parser.add_argument(
        "--train-steps",
        type=int,
        default=None,
        help=f"optimizer steps (default: the full calibrated schedule, {DEFAULT_TRAIN_STEPS})",
    )
    parser.add_argument(
        "--skip-eval", action="store_true", help="skip the temperature-1.0 accuracy estimate after training"
    )
    args = parser.parse_args(argv)

    previous = args.out / BUILD_INFO
    previous_info = json.loads(previous.read_text()) if previous.is_file() else {}
    started = time.monotonic()
    out_dir = build_tiny_model(args.out, seed=args.seed, train_steps=args.train_steps)
    build_seconds = time.monotonic() - started
    digest = weights_hash(out_dir)
    info: dict = {
        "seed": args.seed,
        "train_steps": DEFAULT_TRAIN_STEPS if args.train_steps is None else args.train_steps,
        "weights_hash": digest,
        "build_seconds": round(build_seconds, 1),
        "torch_version": torch.__version__,
    }
    print(f"built {out_dir} in {build_seconds:.0f}s")
    if not args.skip_eval:
        splits = arith_tasks.bundled_splits()
        info["hf_sampled_accuracy"] = {
            "temperature": 1.0,
            "train": round(sampled_accuracy(out_dir, splits["train"], samples=1), 4),
            "eval": round(sampled_accuracy(out_dir, splits["eval"], samples=4), 4),
        }
        print(f"sampled accuracy at temperature 1.0: {info['hf_sampled_accuracy']}")
    if previous_info.get("weights_hash") == digest:
        # Same weights, so measurements taken outside this script (vLLM accuracy) still hold.
        info.update({k: v for k, v in previous_info.items() if k.startswith("vllm_")})
    atomic_write_text(out_dir / BUILD_INFO, json.dumps(info, indent=2) + "\n")
    print(f"weights_hash {digest}")


if __name__ == "__main__":
    main()
