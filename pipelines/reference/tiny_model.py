"""Build the tiny models that ship with rftflow: the default `tiny-arith-llama`, `tiny-tool-llama` and
`tiny-fc-llama`.

rftflow needs a policy that loads in vLLM CPU in seconds and is *partly* right on the bundled tasks, so RL
has reward signal without any download. Both models come from one deterministic builder
(`pipelines.reference.tiny_builder`); a recipe says what each is taught:
1. `arith` (the default model): the arithmetic format only, trained on train-split prompts just long enough
   that temperature-1.0 accuracy lands mid-range (about 0.55 train / 0.42 eval);
2. `tool` (`pipelines.reference.tiny_tool_model`): the same, plus the `tool_math` calculator convention;
3. `fc` (`pipelines.reference.tiny_fc_model`): the tool model, taught to call the calculator by function
   calling (Hermes-style `<tool_call>`, read by vLLM's `hermes` tool parser).
Everything is seeded and single-threaded, so a rebuild with the same seed reproduces the same weights, checked
by `weights_hash` and recorded in BUILD_INFO.json with the figures measured after the build.

Run: `python -m pipelines.tiny_model [--recipe tool|fc] [--out DIR]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from operators.engine.checkpoints import weights_hash
from pipelines.reference import arith_tasks, tool_model_check
from pipelines.reference.tiny_builder import (
    MAX_NEW_TOKENS,
    Conversation,
    Recipe,
    arith_conversation,
    build,
    format_response,
)
from pipelines.reference.tiny_fc_model import FC_RECIPE
from pipelines.reference.tiny_tool_model import TOOL_RECIPE
from schemas.atomic import atomic_write_text
from schemas.config import ASSETS
from schemas.run_dir import BUILD_INFO

__all__ = ["weights_hash"]  # tests and scripts check a build by its weights hash from here

DEFAULT_TRAIN_STEPS = 1500
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def default_model_dir(recipe: Recipe | None = None) -> Path:
    """A model directory shipped in the repo (the default model's unless a recipe is given)."""
    return ASSETS / (recipe or ARITH_RECIPE).name


def extract_answer(text: str) -> str | None:
    """Text inside the first `<answer>...</answer>`, or None when the model broke the format."""
    match = _ANSWER_RE.search(text)
    return match.group(1).strip() if match else None


def prompt_ids(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    """Token ids of the chat-formatted user turn plus the assistant header (what vLLM will see)."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def arith_conversations(seed: int, count: int) -> list[Conversation]:
    """One fresh train-split row per conversation: `generate(count, seed, split="train")`.

    A stream rather than epochs over train.jsonl, so the model learns arithmetic instead of
    memorising 2000 rows (which left eval accuracy far below train). Every row comes from the
    train hash partition, so no eval prompt is ever trained on; for seed 0 the stream starts with
    exactly the rows of the bundled train.jsonl.
    """
    return [arith_conversation(row) for row in arith_tasks.generate(count, seed, split="train")]


def arith_corpus() -> list[str]:
    rows = arith_tasks.bundled_splits()["train"]
    return [row["prompt"] for row in rows] + [format_response(row["answer"]) for row in rows]


ARITH_RECIPE = Recipe(
    name="tiny-arith-llama",
    roles=("system", "user", "assistant"),
    train_steps=DEFAULT_TRAIN_STEPS,
    corpus=arith_corpus,
    conversations=arith_conversations,
)


def build_tiny_model(
    out_dir: Path, seed: int = 0, train_steps: int | None = None, recipe: Recipe = ARITH_RECIPE
) -> Path:
    """Train and save `recipe`'s model into `out_dir` (replaced if present) and return it.

    `train_steps=None` runs the recipe's default schedule that the calibration in BUILD_INFO.json refers to;
    a small value is for fast determinism tests. Training uses only the bundled train splits.
    """
    return build(recipe, out_dir, seed, train_steps)


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


def arith_figures(model_dir: Path) -> dict[str, Any]:
    """The default model's calibration: HF-sampled accuracy on the arithmetic splits."""
    splits = arith_tasks.bundled_splits()
    accuracy = {
        "temperature": 1.0,
        "train": round(sampled_accuracy(model_dir, splits["train"], samples=1), 4),
        "eval": round(sampled_accuracy(model_dir, splits["eval"], samples=4), 4),
    }
    return {"hf_sampled_accuracy": accuracy}


def tool_figures(model_dir: Path) -> dict[str, Any]:
    """The tool model's calibration: tool-call rate and rewards, measured on vLLM."""
    return {"vllm_tool_figures": tool_model_check.calibrate(model_dir)}


def fc_figures(model_dir: Path) -> dict[str, Any]:
    """The function-calling model's calibration: call and parse rates and rewards, measured on vLLM through
    its OpenAI API with the hermes tool parser."""
    return {"vllm_fc_figures": tool_model_check.calibrate_fc(model_dir)}


RECIPES: dict[str, tuple[Recipe, Callable[[Path], dict[str, Any]]]] = {
    "arith": (ARITH_RECIPE, arith_figures),
    "tool": (TOOL_RECIPE, tool_figures),
    "fc": (FC_RECIPE, fc_figures),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.tiny_model",
        description=(
            "Train a tiny Llama + digit BPE tokenizer on the bundled train splits (the tool recipe starts "
            "from the shipped default model) and save it (safetensors, chat template, generation config). "
            "Deterministic for a given recipe, seed and step count; prints the final weights hash and writes "
            "BUILD_INFO.json with the figures measured after the build."
        ),
    )
    parser.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default="arith",
        help="arith: the default model (pipelines/assets/tiny-arith-llama); tool: tiny-tool-llama, also "
        "taught the tool_math calculator; fc: tiny-fc-llama, the tool model calling it by function calling "
        "(hermes); the last two's figures measured on vLLM (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output dir (default: a new folder, models/tiny-<recipe>-<timestamp>; the shipped model is "
        "rebuilt in place only when named, e.g. --out pipelines/assets/tiny-arith-llama)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for init and data order (default: %(default)s)"
    )
    parser.add_argument(
        "--train-steps",
        type=int,
        default=None,
        help="optimizer steps (default: the recipe's calibrated schedule: "
        + ", ".join(f"{name} {recipe.train_steps}" for name, (recipe, _) in RECIPES.items())
        + ")",
    )
    parser.add_argument("--skip-eval", action="store_true", help="skip measuring the figures after training")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    recipe, figures = RECIPES[args.recipe]
    out = args.out or Path("models") / f"tiny-{args.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"

    previous = out / BUILD_INFO
    previous_info = json.loads(previous.read_text()) if previous.is_file() else {}
    started = time.monotonic()
    out_dir = build_tiny_model(out, seed=args.seed, train_steps=args.train_steps, recipe=recipe)
    build_seconds = time.monotonic() - started
    digest = weights_hash(out_dir)
    info: dict = {
        "seed": args.seed,
        "train_steps": recipe.train_steps if args.train_steps is None else args.train_steps,
        "weights_hash": digest,
        "build_seconds": round(build_seconds, 1),
        "torch_version": torch.__version__,
    }
    print(f"built {out_dir} in {build_seconds:.0f}s")
    if not args.skip_eval:
        info.update(figures(out_dir))
        print(f"figures: {json.dumps({k: v for k, v in info.items() if k not in ('seed', 'weights_hash')})}")
    if previous_info.get("weights_hash") == digest:
        # Same weights, so measurements taken outside this script (vLLM accuracy) still hold.
        info.update({k: v for k, v in previous_info.items() if k.startswith("vllm_") and k not in info})
    atomic_write_text(out_dir / BUILD_INFO, json.dumps(info, indent=2) + "\n")
    print(f"weights_hash {digest}")


if __name__ == "__main__":
    main()
