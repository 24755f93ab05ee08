"""The recipe of `tiny-tool-llama`: the default arithmetic model, also taught the `tool_math` calculator.

Same builder, same shape (`pipelines.reference.tiny_builder`), and it starts from the shipped default
model, whose arithmetic it keeps; the default model itself is left as it is. What it adds:
1. a fourth chat role, `tool`, and `<calc>`, `</calc>` as tokens of their own;
2. a training stream of three kinds of conversation, all from the train splits:
   - arithmetic (user prompt, `<answer>`), so the base's skill is kept;
   - decisions: the `tool_math` system prompt and a two-digit-times-two-digit `tool_arith` prompt, then
     either a direct `<answer>` or `<calc>a * b</calc>`, the calculator's result as a `tool` turn, and an
     `<answer>` copying it. The share that call (CALL_SHARE) is what sets the temperature-1 tool-call rate;
   - copy drills: a call and its result where the choice to call is given, not learned, so they teach
     copying the expression and the result without moving the rate. Half show a random number of the
     result's size as the tool's result, which can only be copied, not computed: without them the model went
     on working the product out itself (approximately) after the tool had given it.
Direct answers to these products are mostly wrong and copied results mostly right, so the rate also sets the
`tool_math` reward, leaving RL room to raise both. The measured figures are in its BUILD_INFO.json
(`pipelines.reference.tool_model_check`).

Rebuild: `python -m pipelines.tiny_model --recipe tool`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from operators.workflows.calculator import calculate
from operators.workflows.tool_math import CALL_CLOSE, CALL_OPEN, TOOL_SYSTEM_PROMPT
from pipelines.reference import arith_tasks, tool_arith_tasks
from pipelines.reference.tiny_builder import Conversation, Recipe, Turn, arith_conversation, format_response
from schemas.config import DEFAULT_MODEL

ROLES = ("system", "user", "assistant", "tool")
DECISION_SHARE = 0.3  # of the training conversations: decisions, to call or not
DRILL_SHARE = 0.5  # copy drills; the rest are arithmetic
CALL_SHARE = 0.4  # of the decisions, those that call
TRAIN_STEPS = 1200
PROMPT = re.compile(r"What is (.+)\?")


def tool_conversation(row: dict, calls: bool, shown: str | None = None, given: bool = False) -> Conversation:
    """A `tool_math` conversation of a row: a direct answer, or a call, the result the tool shows (the
    calculator's, unless `shown` is given) and an answer copying it. `given`: the choice to call is taken
    as made (context, not learned)."""
    head = [Turn("system", TOOL_SYSTEM_PROMPT), Turn("user", row["prompt"])]
    if not calls:
        return [*head, Turn("assistant", format_response(row["answer"]))]
    expression = PROMPT.fullmatch(row["prompt"]).group(1)
    result = calculate(expression) if shown is None else shown
    return [
        *head,
        Turn("assistant", f"{CALL_OPEN}{expression}{CALL_CLOSE}", given=int(given)),  # `<calc>` is one token
        Turn("tool", result),
        Turn("assistant", format_response(result)),
    ]


def drill(rng: random.Random, row: dict) -> Conversation:
    """A copy drill: the call is given; half the time the tool shows a random number of the answer's size."""
    digits = len(row["answer"])
    shown = str(rng.randint(10 ** (digits - 1), 10**digits - 1)) if rng.random() < 0.5 else None
    return tool_conversation(row, calls=True, shown=shown, given=True)


def conversations(seed: int, count: int) -> list[Conversation]:
    """`count` training conversations, each a decision, a copy drill or arithmetic (see the module)."""

    def decision(rng: random.Random, row: dict, calls: bool) -> Conversation:
        return tool_conversation(row, calls=calls)

    return mixed_stream(seed, count, (DECISION_SHARE, DRILL_SHARE, CALL_SHARE), decision, drill)


def mixed_stream(
    seed: int,
    count: int,
    shares: tuple[float, float, float],
    decision: Callable[[random.Random, dict, bool], Conversation],
    drill: Callable[[random.Random, dict], Conversation],
) -> list[Conversation]:
    """A tool recipe's training stream: `count` conversations, each a decision on a `tool_arith` row (to call
    in the third share of them), a copy drill, or arithmetic, in the first two shares and the rest. The tool
    models' recipes differ only in how a decision and a drill are written."""
    decision_share, drill_share, call_share = shares
    rng = random.Random(seed)
    kinds = rng.choices(
        ["decision", "drill", "arith"],
        [decision_share, drill_share, 1 - decision_share - drill_share],
        k=count,
    )
    tools = count - kinds.count("arith")
    arith_rows = iter(arith_tasks.generate(count - tools, seed, split="train"))
    tool_rows = iter(tool_arith_tasks.generate(tools, seed, split="train"))
    stream: list[Conversation] = []
    for kind in kinds:
        if kind == "arith":
            stream.append(arith_conversation(next(arith_rows)))
        elif kind == "drill":
            stream.append(drill(rng, next(tool_rows)))
        else:
            row = next(tool_rows)
            stream.append(decision(rng, row, rng.random() < call_share))
    return stream


TOOL_RECIPE = Recipe(
    name="tiny-tool-llama",
    roles=ROLES,
    train_steps=TRAIN_STEPS,
    conversations=conversations,
    base=DEFAULT_MODEL,
    added_tokens=(CALL_OPEN, CALL_CLOSE),
)
