"""Selectors: which rows of one training taskset each step draws (Trinity-RFT 0.6's `data_selector`s).

A selector is a plain object over row positions `0..size-1`, built from the taskset's size, its
`feature_keys` columns (a float matrix, one row per task) and its `SelectorConfig`. It is driven only by the
scheduler (`operators.tasks.scheduler`): `next(count)` draws, `feedback(rows, values)` tells it what tasks
scored, and `state_dict()` / `load_state_dict()` carry everything it needs to go on as JSON values, so a
resumed run draws exactly what an uninterrupted one would. Every random draw comes from a generator seeded by
(seed, draws so far): no generator state has to be saved.

Plugins add selectors with `@register_selector(name)`:

    @register_selector("longest_first")
    class LongestFirst(SelectorBase):
        feature_keys_needed = (1, 1)
        def next(self, count): ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from operators.rollout.registration import import_all, lookup, register_once
from schemas.selector_config import SelectorConfig

BUILTIN_MODULES = ("operators.tasks.difficulty",)


class SelectorBase:
    """File order (`sequential`), and what every selector shares: a draw count and no feedback."""

    feature_keys_needed: ClassVar[tuple[int, int | None]] = (0, None)  # (at least, at most; None: any)
    feedback_driven: ClassVar[bool] = False  # whether its draws depend on feedback (the lag rule applies)

    def __init__(self, size: int, features: np.ndarray, cfg: SelectorConfig):
        self.size, self.features, self.cfg = size, features, cfg
        self.drawn = 0  # rows drawn so far, over every epoch

    def next(self, count: int) -> list[int]:
        rows = [(self.drawn + i) % self.size for i in range(count)]
        self.drawn += count
        return rows

    def feedback(self, rows: Sequence[int], values: Sequence[float]) -> None:
        """What the given rows scored (each a pass rate in [0, 1]); ignored unless `feedback_driven`."""

    def figures(self, rows: Sequence[int]) -> dict[str, float]:
        """The selector's own figures about the rows it just drew, for the step's metrics."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawn = int(state["drawn"])

    def generator(self) -> np.random.Generator:
        """A generator seeded by (seed, draws so far): the same draw after a resume gets the same numbers."""
        return np.random.default_rng([self.cfg.seed, self.drawn])


SELECTORS: dict[str, type[SelectorBase]] = {"sequential": SelectorBase}


def register_selector(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, SelectorBase)):
            raise TypeError(f"selector {getattr(cls, '__qualname__', cls)} must subclass SelectorBase")
        register_once(SELECTORS, "selector", name, cls)
        return cls

    return wrap


def selector_class(name: str) -> type[SelectorBase]:
    """The selector registered as `name` (built-ins, then plugins); KeyError listing the known ones."""
    import_all(BUILTIN_MODULES)
    return lookup(SELECTORS, "selector", name)


def feature_count_problem(cls: type[SelectorBase], given: int) -> str | None:
    """Why `given` feature keys do not suit the selector, if they do not."""
    low, high = cls.feature_keys_needed
    if low <= given and (high is None or given <= high):
        return None
    wanted = str(low) if low == high else f"at least {low}" if high is None else f"{low} to {high}"
    return f"needs {wanted} feature_keys, got {given}"


@register_selector("shuffle")
class ShuffleSelector(SelectorBase):
    """A new permutation each epoch, from a generator seeded by (seed, epoch)."""

    def next(self, count: int) -> list[int]:
        rows, order, epoch = [], None, -1
        for position in range(self.drawn, self.drawn + count):
            if position // self.size != epoch:
                epoch = position // self.size
                order = np.random.default_rng([self.cfg.seed, epoch]).permutation(self.size)
            rows.append(int(order[position % self.size]))
        self.drawn += count
        return rows


@register_selector("random")
class RandomSelector(SelectorBase):
    """Each draw afresh, without repeats inside a draw (unless it asks for more rows than there are)."""

    def next(self, count: int) -> list[int]:
        rows = self.generator().choice(self.size, count, replace=count > self.size)
        self.drawn += count
        return [int(r) for r in rows]


@register_selector("offline_easy2hard")
class EasyToHardSelector(SelectorBase):
    """Rows sorted once by their features (the first key first), highest (easiest) first, then in order;
    ties keep file order. Each epoch starts again from the easiest."""

    feature_keys_needed = (1, None)

    def __init__(self, size: int, features: np.ndarray, cfg: SelectorConfig):
        super().__init__(size, features, cfg)
        keys = [np.arange(size)] + [-features[:, k] for k in reversed(range(features.shape[1]))]
        self.order = np.lexsort(keys)

    def next(self, count: int) -> list[int]:
        rows = [int(self.order[(self.drawn + i) % self.size]) for i in range(count)]
        self.drawn += count
        return rows

    def figures(self, rows: Sequence[int]) -> dict[str, float]:
        return {"feature_mean": float(self.features[list(rows), 0].mean())} if rows else {}
