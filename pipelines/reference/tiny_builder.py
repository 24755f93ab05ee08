"""The deterministic builder behind rftflow's tiny models: one recipe in, one model folder out.

A `Recipe` says what a model is taught: the chat roles its template renders (or a template of its own), the
texts its tokenizer is trained on (or the shipped model it starts from), and the training conversations (only
assistant turns are learned). The builder is the same for every recipe:
1. a digit-level byte BPE tokenizer (one token per digit, so arithmetic is learnable) with a chat template in
   which each turn is `<|role|>content<|eos|>`, eos doubling as end-of-turn so vLLM stops after a reply;
2. a 2-layer Llama (hidden 128, head_dim 64: a size vLLM's CPU attention kernels support);
3. supervised training on the recipe's conversations, in order, BATCH_SIZE a step, warmup then cosine lr;
4. safetensors, tokenizer and generation config saved to the folder.
A recipe with a `base` starts instead from that shipped model (its weights hash checked against its
BUILD_INFO.json), its tokenizer extended with the recipe's new role and plain tokens (the ids it had stay):
a skill added to a model that has one, rather than both learned from scratch at once.
Everything is seeded and single-threaded, so a rebuild with the same seed reproduces the same weights,
checked by `weights_hash`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

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
from schemas.run_dir import BUILD_INFO  # noqa: E402

log = logging.getLogger(__name__)

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
VOCAB_SIZE = 320  # an upper bound: the small corpora run out of merges first
BATCH_SIZE = 64
PEAK_LR = 3e-3
WARMUP_STEPS = 50
MAX_NEW_TOKENS = 24
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


class Turn(NamedTuple):
    """One chat message of a training conversation; an assistant turn's content is learned, but for its first
    `given` tokens, which are context (a choice the conversation takes as made, say)."""

    role: str
    content: str
    given: int = 0


Conversation = list[Turn]


@dataclass(frozen=True)
class Recipe:
    """What one tiny model is taught; the builder does the rest the same way for every recipe."""

    name: str  # its folder under pipelines/assets
    roles: tuple[str, ...]  # the chat roles its template renders; any other is refused
    train_steps: int  # the default schedule, the one its BUILD_INFO.json figures refer to
    conversations: Callable[[int, int], list[Conversation]]  # (seed, count): the training stream, in order
    corpus: Callable[[], list[str]] | None = None  # the texts its tokenizer is trained on (without a base)
    base: Path | None = None  # a shipped model folder to start from, in place of a fresh model
    added_tokens: tuple[str, ...] = ()  # plain tokens added to the base's tokenizer (each one id)
    template: str | None = None  # its chat template, when not the plain one of `chat_template(roles)`


def template_of(recipe: Recipe) -> str:
    return recipe.template if recipe.template is not None else chat_template(recipe.roles)


def role_token(role: str) -> str:
    return f"<|{role}|>"


def chat_template(roles: tuple[str, ...]) -> str:
    """Each turn is `<|role|>content<|eos|>`; a role outside `roles` is refused (vLLM's server says 400)."""
    return (
        "{{ bos_token }}"
        "{% for message in messages %}"
        f"{{% if message['role'] not in {list(roles)} %}}"
        "{{ raise_exception('unsupported role: ' + message['role']) }}"
        "{% endif %}"
        "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )


def format_response(answer: str) -> str:
    """The exact final-answer text every recipe teaches (eos is appended separately)."""
    return f"<answer>{answer}</answer>"


def arith_conversation(row: dict) -> Conversation:
    """A taskset row (`prompt`, `answer`) in the arithmetic format every recipe teaches."""
    return [Turn("user", row["prompt"]), Turn("assistant", format_response(row["answer"]))]


def build_tokenizer(texts: list[str], roles: tuple[str, ...]) -> PreTrainedTokenizerFast:
    """Train a small byte-level BPE on `texts`; digits stay single tokens for arithmetic."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    role_tokens = [role_token(role) for role in roles]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD, *role_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=role_tokens,
        model_max_length=MODEL_SHAPE["max_position_embeddings"],
    )
    fast.chat_template = chat_template(roles)
    return fast


def encode_conversations(
    tokenizer: PreTrainedTokenizerFast, conversations: list[Conversation]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, attention mask, and labels on the assistant turns' content and eos only.

    The ids are the chat template's rendering, built turn by turn: special tokens split the text, so each
    content tokenizes alone exactly as inside the whole string (and as vLLM sees a later turn appended).
    """
    texts = sorted({turn.content for turns in conversations for turn in turns})
    ids_of = dict(zip(texts, tokenizer(texts, add_special_tokens=False)["input_ids"], strict=True))
    roles = {turn.role for turns in conversations for turn in turns}
    role_id = {role: tokenizer.convert_tokens_to_ids(role_token(role)) for role in roles}
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    seqs: list[tuple[list[int], list[int]]] = []
    for turns in conversations:
        ids, labels = [bos], [-100]
        for turn in turns:
            body = [*ids_of[turn.content], eos]
            learned = len(body) - turn.given if turn.role == "assistant" else 0
            ids += [role_id[turn.role], *body]
            labels += [-100] * (1 + len(body) - learned) + body[len(body) - learned :]
        seqs.append((ids, labels))
    width = max(len(ids) for ids, _ in seqs)
    padded_ids, mask, padded_labels = [], [], []
    for ids, labels in seqs:
        pad = width - len(ids)
        padded_ids.append(ids + [tokenizer.pad_token_id] * pad)
        mask.append([1] * len(ids) + [0] * pad)
        padded_labels.append(labels + [-100] * pad)
    return torch.tensor(padded_ids), torch.tensor(mask), torch.tensor(padded_labels)


@contextlib.contextmanager
def deterministic_torch(seed: int) -> Iterator[None]:
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


def lr_at(step: int, total: int) -> float:
    """Linear warmup then cosine decay to 10% of peak: stable for a tiny model at a high lr."""
    warmup = min(WARMUP_STEPS, max(1, total // 10))
    if step < warmup:
        return PEAK_LR * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return PEAK_LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, conversations: list[Conversation], steps: int
) -> None:
    """Supervised fine-tuning on assistant tokens, consuming `conversations` in order, BATCH_SIZE per step."""
    ids, mask, labels = encode_conversations(tokenizer, conversations)
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
            group["lr"] = lr_at(step, steps)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            elapsed = time.monotonic() - started
            log.info("step %d/%d loss %.4f (%.0fs)", step + 1, steps, out.loss.item(), elapsed)
    model.eval()


def fresh_model(recipe: Recipe) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A tokenizer trained on the recipe's corpus and a randomly initialised model sized to it."""
    tokenizer = build_tokenizer(recipe.corpus(), recipe.roles)
    tokenizer.chat_template = template_of(recipe)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
        **MODEL_SHAPE,
    )
    return LlamaForCausalLM(config), tokenizer


def based_model(recipe: Recipe) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """The recipe's base model, checked against the weights hash in its BUILD_INFO.json, with its tokenizer
    extended (new role tokens as special tokens, `added_tokens` as plain ones) and its embeddings grown to
    match (the new rows drawn around the old ones' mean, from the seeded generator)."""
    recorded = json.loads((recipe.base / BUILD_INFO).read_text())["weights_hash"]
    if weights_hash(recipe.base) != recorded:
        raise ValueError(f"{recipe.base}: weights do not match its {BUILD_INFO}; rebuild that model first")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(recipe.base)
    known = set(tokenizer.get_vocab())
    roles = [role_token(role) for role in recipe.roles if role_token(role) not in known]
    tokenizer.add_special_tokens({"additional_special_tokens": roles}, replace_extra_special_tokens=False)
    tokenizer.add_tokens([token for token in recipe.added_tokens if token not in known])
    tokenizer.chat_template = template_of(recipe)
    model = LlamaForCausalLM.from_pretrained(recipe.base, dtype=torch.float32)
    model.resize_token_embeddings(len(tokenizer))
    return model, tokenizer


def build(recipe: Recipe, out_dir: Path, seed: int = 0, train_steps: int | None = None) -> Path:
    """Train and save the recipe's tokenizer and model into `out_dir` (replaced if present); returns it.

    `train_steps=None` runs the recipe's default schedule; a small value is for fast determinism tests.
    """
    steps = recipe.train_steps if train_steps is None else train_steps
    out_dir = Path(out_dir)
    with deterministic_torch(seed):
        model, tokenizer = based_model(recipe) if recipe.base is not None else fresh_model(recipe)
        train(model, tokenizer, recipe.conversations(seed, steps * BATCH_SIZE), steps)
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
