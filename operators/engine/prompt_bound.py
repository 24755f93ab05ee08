"""Refusing a prompt over `max_prompt_tokens` by its length alone, where that is sound, before tokenizing it.

Tokenizing is what costs: 10 MB took 15-25 s with the bundled tokenizer (2 cores), on the engine's event
loop, only to learn that the prompt is over the limit. A lower bound on the token count from the length
needs every token to stand for at most L bytes of the text: then b bytes make at least b / L tokens, and as
each character is at least one byte, c characters make at least c / L. (Bytes >= tokens, the other way round,
proves nothing here.)

That holds for a byte-level BPE tokenizer that drops nothing, L being its longest vocabulary or added token in
bytes. Anything that lets one token cover an unbounded run of text voids it: a normalizer (NFC merges, NFKC,
whitespace collapsing), a pre-tokenizer that removes what it splits on, an unknown-token fallback
(WordPiece's [UNK] for an over-long word, fused unknowns, a byte missing from the vocabulary), an added token
that strips the whitespace beside it. So L is given only for tokenizers made of parts known to keep every
byte, and is None (no early refusal) for the rest.
"""

from __future__ import annotations

import json
from typing import Any

from tokenizers.pre_tokenizers import ByteLevel

from schemas.errors import TaskInputError

# Pre-tokenizers that split text without dropping any of it (unless told to remove what they split on).
KEEPING_PRE_TOKENIZERS = frozenset({"ByteLevel", "Digits", "Split", "Punctuation"})


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most bytes of text one token can stand for, or None where no such bound is known to hold."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # not a Hugging Face fast tokenizer: nothing is known
        return None
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    pre = spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if spec.get("normalizer") is not None or model.get("type") != "BPE":
        return None
    if any(p.get("type") not in KEEPING_PRE_TOKENIZERS or p.get("behavior") == "Removed" for p in parts):
        return None
    vocab = model.get("vocab") or {}
    alphabet = set(ByteLevel.alphabet())  # one character per byte of text
    if not any(p.get("type") == "ByteLevel" for p in parts) or not alphabet <= vocab.keys():
        return None
    added = spec.get("added_tokens") or []
    if any(token.get("lstrip") or token.get("rstrip") for token in added):
        return None
    # A vocabulary character outside the alphabet counts as its UTF-8 length: more than it can stand for.
    longest = (sum(1 if c in alphabet else len(c.encode()) for c in token) for token in vocab)
    return max([*longest, *(len(token["content"].encode()) for token in added)])


def refuse_by_length(
    text: str, limit: int | None, token_bytes: int | None, limit_name: str = "max_prompt_tokens"
) -> None:
    """Raise TaskInputError when `text` has more than `limit` tokens by its length alone."""
    if limit is None or token_bytes is None or len(text) <= limit * token_bytes:
        return
    raise TaskInputError(
        f"prompt has at least {-(-len(text) // token_bytes)} tokens ({len(text)} characters, at most "
        f"{token_bytes} bytes a token), more than {limit_name}={limit}"
    )
