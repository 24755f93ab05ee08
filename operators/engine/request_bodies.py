"""What the gate reads of an OpenAI- or Anthropic-style request body before vLLM sees it: its prompt text
(for the length rules, which refuse an over-long prompt before tokenizing it), its `max_tokens`, and the
features a session cannot record."""

from __future__ import annotations

from typing import Any

# the text-bearing fields of messages, Responses input items and content parts
TEXT_FIELDS = ("content", "text", "output", "arguments")


def texts_of(value: Any) -> list[str]:
    """Every string held in the text fields of a message, an input item or a content part, and in lists
    of them."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for item in value for text in texts_of(item)]
    if isinstance(value, dict):
        return [text for key in TEXT_FIELDS if key in value for text in texts_of(value[key])]
    return []


def request_text(body: dict[str, Any]) -> str:
    """All prompt text of a request body: completions' `prompt`, chat's and Anthropic's `messages` (and its
    `system`), the Responses API's `input` and `instructions`."""
    parts: list[str] = []
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        parts.append(prompt)
    elif isinstance(prompt, list):
        parts += [p for p in prompt if isinstance(p, str)]
    for key in ("instructions", "system", "input", "messages"):
        parts += texts_of(body.get(key))
    return "".join(parts)


def requested_max_tokens(body: dict[str, Any]) -> int | None:
    """The most tokens the request asks to sample, under any of the APIs' names for it."""
    for key in ("max_completion_tokens", "max_output_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def unrecordable(body: dict[str, Any]) -> str | None:
    """Why a session could not record this request as one call of its run, or None."""
    if body.get("background"):
        return "background mode is not served: the call must answer within its request"
    if body.get("previous_response_id"):
        return (
            f"previous_response_id {body['previous_response_id']!r} is not held: this engine stores no "
            "responses, so send the whole conversation as `input`"
        )
    return None
