"""`difficulty_based`: draw the tasks whose estimated pass rate is nearest a target (Trinity-RFT 0.6's
meaning), with the estimates learnt from feedback.

Each task's pass rate is a Beta(alpha, beta) belief. Its prior comes from two feature columns, the pass rates
of a weak and a strong reference model: the policy's capability is placed between them by a coefficient
fitted on the feedback so far, and the belief of every task is pulled towards that interpolation, while the
tasks just measured are pulled towards what they scored. Unlike Trinity-RFT, whose saved state is only the
draw count (a resumed run starts again from the priors), the whole belief is saved: a resumed run draws what
an uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from operators.tasks.selectors import SelectorBase, register_selector
from schemas.selector_config import SelectorConfig

CAPABILITY_DISCOUNT = 0.9  # weight of the previous capability coefficient in its running average
ADAPT_ERROR = 0.25  # with `adaptive_rho`: a mean prediction error this large halves `rho`


@register_selector("difficulty_based")
class DifficultySelector(SelectorBase):
    """kwargs: `target_reward` (1.0), `tau` (1.0; 0 draws the best scores greedily), `do_sample` (false: the
    belief's mean; true: a draw from it), `m` (16 pseudo-samples a measurement counts as), `lamb` (0.2, how
    fast old evidence fades), `rho` (0.2, the interpolation's weight), `adaptive_rho` (false)."""

    feature_keys_needed = (2, 2)
    feedback_driven = True

    def __init__(self, size: int, features: np.ndarray, cfg: SelectorConfig):
        super().__init__(size, features, cfg)
        args = cfg.kwargs
        self.target = float(args.get("target_reward", 1.0))
        self.tau = float(args.get("tau", 1.0))
        self.do_sample = bool(args.get("do_sample", False))
        self.m = float(args.get("m", 16))
        self.lamb = float(args.get("lamb", 0.2))
        self.rho = float(args.get("rho", 0.2))
        self.adaptive_rho = bool(args.get("adaptive_rho", False))
        self.alphas = np.ones(size)
        self.betas = np.ones(size)
        self.capability: float | None = None
        self.updates = 0

    def pass_rates(self, rng: np.random.Generator) -> np.ndarray:
        if self.do_sample:
            return rng.beta(self.alphas, self.betas)
        return self.alphas / (self.alphas + self.betas)

    def next(self, count: int) -> list[int]:
        rng = self.generator()
        scores = -np.abs(self.target - self.pass_rates(rng))
        if self.tau == 0:
            rows = np.argsort(-scores, kind="stable")[:count]
        else:
            logits = scores / self.tau
            weights = np.exp(logits - logits.max())
            rows = rng.choice(self.size, count, replace=count > self.size, p=weights / weights.sum())
        self.drawn += count
        return [int(r) for r in rows]

    def feedback(self, rows: Sequence[int], values: Sequence[float]) -> None:
        if not len(rows):
            return
        measured: dict[int, list[float]] = {}
        for row, value in zip(rows, values, strict=True):
            measured.setdefault(int(row), []).append(min(1.0, max(0.0, float(value))))
        index = np.array(sorted(measured))
        rates = np.array([np.mean(measured[r]) for r in index])
        weak, strong = self.features[:, 0], self.features[:, 1]
        anchors = self.features[index].mean(axis=0)
        estimate = (rates.mean() - anchors[0]) / (anchors[1] - anchors[0] + 1e-6)
        if self.capability is None:
            self.capability = float(estimate)
        else:
            self.capability = float(
                CAPABILITY_DISCOUNT * self.capability + (1 - CAPABILITY_DISCOUNT) * estimate
            )
        prior = np.clip((strong - weak) * self.capability + weak, 0.0, 1.0)
        if self.adaptive_rho and np.mean(np.abs(prior[index] - rates)) >= ADAPT_ERROR:
            self.rho *= 0.5
        prior[index] = rates
        successes, failures = np.zeros(self.size), np.zeros(self.size)
        successes[index], failures[index] = rates * self.m, (1 - rates) * self.m
        keep = 1 - self.lamb
        self.alphas = keep * self.alphas + self.lamb + (1 - self.rho) * successes + self.rho * prior * self.m
        self.betas = (
            keep * self.betas + self.lamb + (1 - self.rho) * failures + self.rho * (1 - prior) * self.m
        )
        self.updates += 1

    def figures(self, rows: Sequence[int]) -> dict[str, float]:
        means = self.alphas / (self.alphas + self.betas)
        out = {"mean_pass_rate": float(means.mean())}
        if len(rows):
            out["estimated_pass_rate"] = float(means[list(rows)].mean())
        if self.capability is not None:
            out["capability"] = self.capability
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "drawn": self.drawn,
            "alphas": self.alphas.tolist(),
            "betas": self.betas.tolist(),
            "capability": self.capability,
            "rho": self.rho,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawn = int(state["drawn"])
        self.alphas = np.array(state["alphas"], dtype=float)
        self.betas = np.array(state["betas"], dtype=float)
        self.capability = state["capability"]
        self.rho = float(state["rho"])
        self.updates = int(state["updates"])
