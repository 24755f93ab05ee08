"""A training taskset's `data_selector` (Trinity-RFT's name; `task_selector` is its older one): which of the
taskset's rows each step draws, in what order. The names and meanings are Trinity-RFT 0.6's; what each
selector does lives in `operators.tasks.selectors`, which also checks the name (plugins may add selectors, so
the schema cannot list them)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from schemas.config_base import Strict

SEQUENTIAL = "sequential"
# The built-ins (registered in `operators.tasks.selectors`), under Trinity-RFT's names: what a Trinity config
# may name.
BUILTIN_SELECTORS = (SEQUENTIAL, "shuffle", "random", "offline_easy2hard", "difficulty_based")


class SelectorConfig(Strict):
    selector_type: str = Field(
        SEQUENTIAL,
        min_length=1,
        description="`sequential` (file order), `shuffle` (a new order each epoch), `random` (each step "
        "drawn afresh), `offline_easy2hard` (sorted by `feature_keys`, higher is easier), "
        "`difficulty_based` (pass rates estimated from feedback), or a plugin's (see Tasksets)",
    )
    seed: int = Field(42, ge=0, le=2**63 - 1, description="the selector's random seed")
    feature_keys: list[str] = Field(
        [],
        description="taskset columns the selector reads: `offline_easy2hard` one or more, "
        "`difficulty_based` exactly two (prior pass rates of a weak and a strong model)",
    )
    kwargs: dict[str, Any] = Field(
        {},
        description="the selector's own settings; `difficulty_based`: `do_sample` (false), `target_reward` "
        "(1.0), `tau` (1.0; 0: greedy), `m` (16), `lamb` (0.2), `rho` (0.2)",
    )

    @property
    def is_default(self) -> bool:
        return self.selector_type == SEQUENTIAL
