"""A selector plugin: a difficulty pool, as prime-rl composes one (`--plugin-dir examples/selectors`).

Each task sits in a pool by what its steps measured so far: `unseen`, `failed` (mean reward 0), `learning`
(between) or `solved` (1). A draw picks a pool by `kwargs.weights` (among pools that hold a task), then a
task of it, from a generator seeded by (seed, draws so far). Its state is the per-task reward sums and
counts, so a resume draws on exactly. The admission gate prime-rl pairs it with, dropping groups whose
rewards are all equal (no advantage to learn from), is the built-in experience op `reward_std_filter`.

    tasksets:
      - name: arith
        data_selector: {selector_type: difficulty_pool, kwargs: {weights: {learning: 4, unseen: 1}}}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from operators.workflows import SelectorBase, register_selector

POOLS = ("unseen", "failed", "learning", "solved")


@register_selector("difficulty_pool")
class DifficultyPool(SelectorBase):
    def __init__(self, size: int, features: np.ndarray, cfg: Any):
        super().__init__(size, features, cfg)
        given = cfg.kwargs.get("weights", {})
        self.weights = {
            pool: float(given.get(pool, 1.0 if pool in ("unseen", "learning") else 0.0)) for pool in POOLS
        }
        self.sums, self.counts = np.zeros(size), np.zeros(size)

    def pools(self) -> dict[str, np.ndarray]:
        mean = np.divide(self.sums, self.counts, out=np.zeros(self.size), where=self.counts > 0)
        seen = self.counts > 0
        return {
            "unseen": np.flatnonzero(~seen),
            "failed": np.flatnonzero(seen & (mean <= 0.0)),
            "learning": np.flatnonzero(seen & (mean > 0.0) & (mean < 1.0)),
            "solved": np.flatnonzero(seen & (mean >= 1.0)),
        }

    def next(self, count: int) -> list[int]:
        rng, pools = self.generator(), self.pools()
        open_pools = [p for p in POOLS if len(pools[p]) and self.weights[p] > 0] or [
            p for p in POOLS if len(pools[p])
        ]
        weights = np.array([self.weights[p] or 1.0 for p in open_pools])
        chosen = rng.choice(len(open_pools), count, p=weights / weights.sum())
        rows = [int(rng.choice(pools[open_pools[k]])) for k in chosen]
        self.drawn += count
        return rows

    def feedback(self, rows: Sequence[int], values: Sequence[float]) -> None:
        np.add.at(self.sums, list(rows), list(values))
        np.add.at(self.counts, list(rows), 1)

    def figures(self, rows: Sequence[int]) -> dict[str, float]:
        return {f"pool_{name}": float(len(members)) for name, members in self.pools().items()}

    def state_dict(self) -> dict[str, Any]:
        return {"drawn": self.drawn, "sums": self.sums.tolist(), "counts": self.counts.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawn = int(state["drawn"])
        self.sums, self.counts = np.array(state["sums"]), np.array(state["counts"])
