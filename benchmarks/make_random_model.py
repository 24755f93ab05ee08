"""Build a randomly initialised Llama of a given size with the embedded model's tokenizer, for benchmarks.

The tiny default model is so cheap that any overhead dominates; a ~100M-parameter model shows how the
pipeline behaves when the engine does real work. Nothing is downloaded.

    python benchmarks/make_random_model.py --out /tmp/llama-100m [--hidden 768 --layers 12]
    python benchmarks/make_random_model.py --out /tmp/llama-100m-fc \
        --tokenizer-from pipelines/assets/tiny-fc-llama

`--tokenizer-from` takes the tokenizer and chat template of another bundled model: tiny-fc-llama's renders
tool calls and `tool` messages, which `benchmarks/multi_turn.py --agents` needs.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def build(out: Path, hidden: int, layers: int, seed: int = 0, tokenizer_from: Path | None = None) -> int:
    """Write the model to `out`, with the tokenizer of `tokenizer_from` (default: the embedded model's);
    returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from schemas.config import DEFAULT_MODEL

    source = tokenizer_from or DEFAULT_MODEL
    tiny = LlamaConfig.from_pretrained(source)
    config = LlamaConfig(
        vocab_size=tiny.vocab_size,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=tiny.max_position_embeddings,
        bos_token_id=tiny.bos_token_id,
        eos_token_id=tiny.eos_token_id,
        pad_token_id=tiny.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="output model directory")
    parser.add_argument("--hidden", type=int, default=768, help="hidden size (a multiple of 64)")
    parser.add_argument("--layers", type=int, default=12, help="decoder layers")
    parser.add_argument(
        "--tokenizer-from", type=Path, help="model directory whose tokenizer and chat template to take"
    )
    args = parser.parse_args()
    count = build(args.out, args.hidden, args.layers, tokenizer_from=args.tokenizer_from)
    print(f"{args.out}: {count / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
