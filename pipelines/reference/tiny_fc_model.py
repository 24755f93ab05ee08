"""The recipe of `tiny-fc-llama`: the tool model, taught to call the calculator by function calling.

Agent frameworks call tools with `tools=[...]` in the request and read `tool_calls` in the reply; vLLM's
OpenAI API makes the one from the other with a tool parser. This model writes Hermes-style calls, read by
vLLM's stock `hermes` parser:
`<tool_call>{"name": "calculator", "arguments": {"expression": "47 * 83"}}</tool_call>`, in exactly the bytes
the parser re-serialises (`operators.workflows.tool_math_fc.hermes_call`), so its chat template renders an
OpenAI-style history (an assistant message with `tool_calls`, then `role: tool` messages) back to the sampled
bytes, and a multi-turn run merges into one experience.

Same builder and shape (`pipelines.reference.tiny_builder`), starting from the shipped tool model, whose
`tool` role, copying of an expression into a call and of a result into an answer it reuses. It adds:
1. `<tool_call>`, `</tool_call>`, the fixed JSON before the expression and the one after it as tokens of their
   own, so a call is about ten tokens of the 256-position context;
2. a chat template that renders `tool_calls` (their arguments a dict, as vLLM hands them to it, or a JSON
   string) and never the `tools` schemas: one JSON schema alone would fill the context;
3. a training stream: decisions on `tool_arith` prompts (a call in CALL_SHARE of them, else a direct answer;
   after a call, the result as a `tool` turn and an `<answer>` copying it), each with no system prompt or
   one of a few short ones, as agent frameworks send their own; copy drills (the call's first token given,
   half with a random result that can only be copied); and arithmetic, so the base's skill is kept.
Greedy decoding calls on every two-digit product; at temperature 1 about CALL_SHARE of runs call, leaving RL
room to raise the rate. The measured figures are in its BUILD_INFO.json (`pipelines.reference.
tool_model_check.calibrate_fc`).

Rebuild (after the tool model, which it starts from): `python -m pipelines.tiny_model --recipe fc`.
"""

from __future__ import annotations

import random
import re

from operators.workflows.calculator import calculate
from operators.workflows.tool_math_fc import (
    CALL_PREFIX,
    CALL_SUFFIX,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    hermes_call,
)
from pipelines.reference.tiny_builder import Conversation, Recipe, Turn, format_response
from pipelines.reference.tiny_tool_model import mixed_stream
from schemas.config import TOOL_MODEL

ROLES = ("system", "user", "assistant", "tool")
DECISION_SHARE = 0.45  # of the training conversations: decisions, to call or not
DRILL_SHARE = 0.45  # copy drills; the rest are arithmetic
CALL_SHARE = 0.65  # of the decisions, those that call; at 0.6 the T=1 call rate sat on its 0.6 band
TRAIN_STEPS = 800
PROMPT = re.compile(r"What is (.+)\?")
# Short system prompts as agents send them; a conversation has none half the time.
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "Use the calculator tool.",
    "You are a math agent. Use the calculator.",
    "Answer as <answer>N</answer>.",
)
TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    f"{{% if message['role'] not in {list(ROLES)} %}}"
    "{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{% for call in message['tool_calls'] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    f"{{{{ '{TOOL_CALL_OPEN}{{\"name\": ' + function['name'] | tojson + ', \"arguments\": ' }}}}"
    "{% if function['arguments'] is string %}{{ function['arguments'] }}"
    "{% else %}{{ function['arguments'] | tojson }}{% endif %}"
    f"{{{{ '}}{TOOL_CALL_CLOSE}' }}}}"
    "{% endfor %}"
    "{% endif %}"
    "{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def head(rng: random.Random, row: dict) -> Conversation:
    """The user's question, after no system prompt or one of SYSTEM_PROMPTS."""
    system = rng.choice(SYSTEM_PROMPTS) if rng.random() < 0.5 else None
    return [*([Turn("system", system)] if system else []), Turn("user", row["prompt"])]


def fc_conversation(
    rng: random.Random, row: dict, calls: bool, shown: str | None = None, given: bool = False
) -> Conversation:
    """A conversation of a `tool_arith` row: a direct answer, or a call, the result the tool shows (the
    calculator's, unless `shown` is given) and an answer copying it. `given`: the call's first token is
    context, not learned (the choice to call taken as made)."""
    if not calls:
        return [*head(rng, row), Turn("assistant", format_response(row["answer"]))]
    expression = PROMPT.fullmatch(row["prompt"]).group(1)
    result = calculate(expression) if shown is None else shown
    return [
        *head(rng, row),
        Turn("assistant", hermes_call(expression), given=int(given)),  # `<tool_call>` is one token
        Turn("tool", result),
        Turn("assistant", format_response(result)),
    ]


def drill(rng: random.Random, row: dict) -> Conversation:
    """A copy drill: the call is given; half the time the tool shows a random number of the answer's size."""
    digits = len(row["answer"])
    shown = str(rng.randint(10 ** (digits - 1), 10**digits - 1)) if rng.random() < 0.5 else None
    return fc_conversation(rng, row, calls=True, shown=shown, given=True)


def conversations(seed: int, count: int) -> list[Conversation]:
    """`count` training conversations, each a decision, a copy drill or arithmetic (see the module)."""

    def decision(rng: random.Random, row: dict, calls: bool) -> Conversation:
        return fc_conversation(rng, row, calls=calls)

    return mixed_stream(seed, count, (DECISION_SHARE, DRILL_SHARE, CALL_SHARE), decision, drill)


FC_RECIPE = Recipe(
    name="tiny-fc-llama",
    roles=ROLES,
    train_steps=TRAIN_STEPS,
    conversations=conversations,
    base=TOOL_MODEL,
    added_tokens=(TOOL_CALL_OPEN, TOOL_CALL_CLOSE, CALL_PREFIX, CALL_SUFFIX),
    template=TEMPLATE,
)
