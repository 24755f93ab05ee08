"""The engine's prompt side: chat rendering, tokenizing, the prompt limit and its overflow rule, and the
text a later conversation turn appends to the ids sampled so far.

It is everything the engine decides about a prompt before vLLM sees it, on the engine's tokenizer and its
`max_model_len`, kept apart from the engine's requests, admission and weights (`actor.py`).
"""

from __future__ import annotations

from typing import Any

from operators.engine.prompt_bound import max_token_bytes, refuse_by_length
from operators.engine.request_bodies import request_text, requested_max_tokens
from schemas.errors import TaskInputError


class Prompts:
    """Prompts under `max_prompt_tokens` (else what `max_model_len` leaves after `max_tokens`): a longer one
    is refused, or cut to its last tokens, by `prompt_overflow`."""

    def __init__(
        self, tokenizer: Any, max_model_len: int, max_prompt_tokens: int | None, prompt_overflow: str
    ):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.max_prompt_tokens, self.prompt_overflow = max_prompt_tokens, prompt_overflow
        self.token_bytes = max_token_bytes(tokenizer)  # None: no early refusal is sound

    def limit(self, sampling: dict[str, Any]) -> int:
        """The longest prompt a request may have: `max_prompt_tokens`, else what `max_model_len` leaves after
        the request's `max_tokens` (vLLM would reject a longer one only after tokenizing and queueing it)."""
        if self.max_prompt_tokens is not None:
            return self.max_prompt_tokens
        return max(1, self.max_model_len - int(sampling.get("max_tokens") or 16))

    @property
    def limit_name(self) -> str:
        return "max_prompt_tokens" if self.max_prompt_tokens is not None else "max_model_len - max_tokens"

    def check_request(self, body: dict[str, Any]) -> None:
        """The prompt rules for an OpenAI API request: refused by its text's length alone, untokenized."""
        if self.prompt_overflow == "refuse":
            limit = self.limit({"max_tokens": requested_max_tokens(body) or 1})
            refuse_by_length(request_text(body), limit, self.token_bytes, self.limit_name)

    def decode(self, ids: list[int]) -> str:
        """Text of token ids as the tokenizer writes them, special tokens included (nothing dropped)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def render_chat(self, messages: list[dict[str, Any]], limit: int | None = None) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.encode(text, add_special_tokens=False, limit=limit)

    def encode(self, text: str, add_special_tokens: bool, limit: int | None = None) -> list[int]:
        """Token ids; under `prompt_overflow: refuse`, a text over `limit` tokens by its length alone is
        refused untokenized (operators/prompt_bound.py): tokenizing 10 MB takes 15-25 s on this loop."""
        if self.prompt_overflow == "refuse":
            refuse_by_length(text, limit, self.token_bytes, self.limit_name)
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def fit(self, prompt_ids: list[int], limit: int) -> list[int]:
        """Apply the prompt limit: refuse a longer prompt, or keep its last tokens (the question's end and
        the generation prompt, which a chat template puts last)."""
        if len(prompt_ids) <= limit:
            return prompt_ids
        if self.prompt_overflow == "truncate":
            return prompt_ids[-limit:]
        raise TaskInputError(f"prompt has {len(prompt_ids)} tokens, more than {self.limit_name}={limit}")

    def prompt_ids(self, prompt: str | list[int], limit: int) -> list[int]:
        """A text prompt tokenized (with the special tokens), or ids as given; fitted to `limit`."""
        ids = self.encode(prompt, add_special_tokens=True, limit=limit) if isinstance(prompt, str) else prompt
        return self.fit(list(ids), limit)

    def turn(self, messages: list[dict[str, Any]], history: list[int]) -> list[int]:
        """The ids of a conversation's next prompt, whose ids so far are `history`: `history` plus only the
        text `continuation` finds, or, when there is none, `messages` rendered afresh; under the context
        (`max_model_len - 1`)."""
        context = self.max_model_len - 1
        delta = self.continuation(messages, history)
        if delta is not None:
            return [*history, *self.encode(delta, add_special_tokens=False, limit=context)]
        return self.render_chat(messages, limit=context)

    def continuation(self, messages: list[dict[str, Any]], history: list[int]) -> str | None:
        """The text after the last assistant message's content in the template's rendering of `messages`,
        or None when that rendering does not begin with the earlier turns' prompt and that content."""
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        content = None if last is None else messages[last].get("content")
        if not isinstance(content, str):
            return None
        render = self.tokenizer.apply_chat_template
        head = render(messages[:last], add_generation_prompt=True, tokenize=False) + content
        text = render(messages, add_generation_prompt=True, tokenize=False)
        if not text.startswith(head):
            return None
        delta = text[len(head) :]
        # A stop token the engine sampled (and kept in the ids) already closes the turn the template closes.
        if history and history[-1] in set(getattr(self.tokenizer, "all_special_ids", ())):
            closing = self.decode(history[-1:])
            if delta.startswith(closing):
                delta = delta[len(closing) :]
        return delta
