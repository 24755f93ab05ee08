"""The taskset scheduler: which (taskset, row) each step's tasks are, over several tasksets and their
selectors, with feedback taking effect by a fixed rule.

- **Mix.** Each epoch lists every taskset as often as its size times its `weight` (Trinity-RFT's default
  mix, plus rftflow's weight), shuffled by a generator seeded by (mix seed, epoch); step N takes the next
  `batch_size` entries. The mix is a function of the step alone, so it holds no state.
- **Selectors** (`operators.tasks.selectors`) then draw each taskset's rows, in the mix's order.
- **Feedback lag.** Step N's draws see the feedback of steps <= N - lag - 1 only, applied in step order just
  before step N draws: an uninterrupted run is reproducible whatever the timing, and so is a resumed one.
- **State.** `checkpoint(C)` is the state a run resumes from after committing step C: the state before step
  C + 1 drew, plus the feedback of steps up to C not yet applied. Feedback of uncommitted steps is never in
  it, because feedback is only ever given for committed steps.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from operators.tasks.selectors import SelectorBase

Feedback = dict[int, tuple[list[int], list[float]]]  # taskset index -> (rows, pass rates)


class TasksetMix:
    """Which taskset each position of the run draws from: every taskset `round(size * weight)` times (at
    least once) per epoch, in an order shuffled per epoch."""

    def __init__(self, sizes: Sequence[int], weights: Sequence[float], seed: int):
        self.counts = [max(1, round(size * weight)) for size, weight in zip(sizes, weights, strict=True)]
        self.base = np.repeat(np.arange(len(self.counts)), self.counts)
        self.seed = seed
        self.cached: tuple[int, np.ndarray] | None = None

    @property
    def epoch_length(self) -> int:
        return len(self.base)

    def order(self, epoch: int) -> np.ndarray:
        if self.cached is None or self.cached[0] != epoch:
            self.cached = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.base))
        return self.cached[1]

    def tasksets_at(self, start: int, count: int) -> list[int]:
        """The taskset of each position `start .. start + count - 1`, across epoch ends."""
        n = self.epoch_length
        return [int(self.order(p // n)[p % n]) for p in range(start, start + count)]


@dataclass(frozen=True)
class Pick:
    taskset: int
    row: int
    draw: int  # the how-manieth draw from its taskset (0-based): what names the task uniquely


class TaskScheduler:
    """Draws step after step; told each committed step's feedback, in order (`feedback`)."""

    def __init__(self, selectors: list[SelectorBase], mix: TasksetMix, batch_size: int, lag: int):
        self.selectors, self.mix, self.batch_size, self.lag = selectors, mix, batch_size, lag
        self.feedback_driven = any(s.feedback_driven for s in selectors)
        self.next_step = 1  # the next step to draw
        self.applied = 0  # feedback applied up to this step
        self.fed = 0  # feedback given up to this step (committed steps)
        self.pending: dict[int, Feedback] = {}  # given, not yet applied
        self.history: dict[int, Feedback] = {}  # given, and perhaps needed by a checkpoint
        self.snapshots: dict[int, dict[str, Any]] = {}  # step -> the state just before it drew
        self.figures: dict[int, dict[str, float]] = {}  # step -> its selectors' figures

    def can_draw(self, step: int) -> bool:
        """Whether every feedback step `step` must see has been given."""
        return not self.feedback_driven or step - self.lag - 1 <= self.fed

    def draw(self, step: int, count: int) -> list[Pick]:
        """Step `step`'s tasks (`count` of them): steps are drawn in order, each once."""
        if step != self.next_step:
            raise ValueError(f"step {step} drawn out of order (next is {self.next_step})")
        if not self.can_draw(step):
            raise ValueError(f"step {step} needs the feedback of step {step - self.lag - 1}, not yet given")
        self.snapshots[step] = self.state_dict()
        for done in sorted(s for s in self.pending if s <= step - self.lag - 1):
            for index, (rows, values) in sorted(self.pending.pop(done).items()):
                self.selectors[index].feedback(rows, values)
            self.applied = done
        order = self.mix.tasksets_at((step - 1) * self.batch_size, count)
        drawn: dict[int, list[int]] = {}
        starts: dict[int, int] = {}
        for index in sorted(set(order)):
            starts[index] = self.selectors[index].drawn
            drawn[index] = self.selectors[index].next(order.count(index))
        taken = dict.fromkeys(drawn, 0)
        picks = []
        for index in order:
            k = taken[index]
            picks.append(Pick(index, drawn[index][k], starts[index] + k))
            taken[index] = k + 1
        self.figures[step] = {  # every selector's, whether it drew in this step or not
            f"{index}/{name}": value
            for index, selector in enumerate(self.selectors)
            for name, value in selector.figures(drawn.get(index, [])).items()
        }
        self.next_step = step + 1
        return picks

    def feedback(self, step: int, given: Feedback) -> None:
        """What committed step `step` measured; every committed step is given, in order (even empty)."""
        if step != self.fed + 1:
            raise ValueError(f"feedback of step {step} given out of order (next is {self.fed + 1})")
        self.pending[step] = self.history[step] = given
        self.fed = step

    def checkpoint(self, committed: int) -> dict[str, Any]:
        """The state to resume from once step `committed` is committed and its feedback given."""
        state = self.snapshots.get(committed + 1) or self.state_dict()
        state = copy.deepcopy(state)
        state["pending"] = {
            str(step): encode(given)
            for step, given in sorted(self.history.items())
            if state["applied"] < step <= committed
        }
        state["fed"] = committed
        for step in [s for s in self.snapshots if s <= committed]:
            del self.snapshots[step]
        for step in [s for s in self.history if s <= state["applied"]]:
            del self.history[step]
        return state

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_step": self.next_step,
            "applied": self.applied,
            "fed": self.fed,
            "pending": {str(step): encode(given) for step, given in self.pending.items()},
            "selectors": [s.state_dict() for s in self.selectors],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_step, self.applied, self.fed = state["next_step"], state["applied"], state["fed"]
        self.pending = {int(step): decode(given) for step, given in state["pending"].items()}
        self.history = dict(self.pending)
        for selector, saved in zip(self.selectors, state["selectors"], strict=True):
            selector.load_state_dict(saved)
        self.snapshots.clear()


def encode(given: Feedback) -> dict[str, list[list[float]]]:
    return {str(index): [list(rows), list(values)] for index, (rows, values) in given.items()}


def decode(saved: dict[str, list[list[float]]]) -> Feedback:
    return {int(index): ([int(r) for r in rows], list(values)) for index, (rows, values) in saved.items()}
