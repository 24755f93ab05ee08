"""Did the policy learn? The before and after of a closed-loop run, from its committed experiences.

A run with a trainer beside it (`explore --with-trainer`, `make demo`) ends by saying how its training
reward and each reward part moved, the mean over the first steps against the last ones, and how each eval
taskset moved from its first evaluation to its last; and by drawing both against step (`learning.png`).
Everything is read from the experiences the run committed and the eval experiences it kept, so the figures
are those a trainer saw, not a separate measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipelines.report_lib.experiences import read_eval, read_experiences
from pipelines.report_lib.plots import legend_below, new_figure, save_png
from pipelines.report_lib.summaries import StepStats, eval_series, reward_series

WINDOW = 5  # steps averaged at each end of the run ("the first 5 steps" against "the last 5")
FIGURE = "learning.png"


@dataclass(frozen=True)
class Change:
    """One figure before and after: a reward part's mean over the first and last steps, or an eval's."""

    name: str
    before: float
    after: float

    @property
    def rise(self) -> float:
        return self.after - self.before

    def render(self, width: int) -> str:
        return f"{self.name:<{width}} {self.before:.3f} -> {self.after:.3f} ({self.rise:+.3f})"


@dataclass
class Learning:
    """The training curves' ends (`window` steps each) and each eval taskset's first and last evaluation."""

    first_steps: list[int]
    last_steps: list[int]
    training: list[Change]
    evals: dict[str, tuple[int, int, list[Change]]] = field(default_factory=dict)  # taskset -> steps, changes

    def render(self) -> str:
        names = [c.name for c in self.training] + [c.name for *_, cs in self.evals.values() for c in cs]
        width = max(map(len, names), default=0)
        lines = []
        if self.training:
            lines.append(
                f"  training, mean of steps {span(self.first_steps)} -> steps {span(self.last_steps)}:"
            )
            lines += [f"    {c.render(width)}" for c in self.training]
        for taskset, (first, last, changes) in self.evals.items():
            lines.append(f"  eval {taskset}, step {first} -> step {last}:")
            lines += [f"    {c.render(width)}" for c in changes]
        return "\n".join(lines)


def span(steps: list[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


def window_mean(stats: StepStats, steps: list[int]) -> float:
    """The mean over `steps` of each step's mean: every step weighs the same, however many samples it had."""
    by_step = dict(zip(stats.steps, stats.mean, strict=True))
    values = [by_step[s] for s in steps if s in by_step]
    return sum(values) / len(values) if values else float("nan")


def measure(experiences: pa.Table, evals: pa.Table, window: int = WINDOW) -> Learning | None:
    """The before and after of the run (None when it committed fewer than two steps and evaluated fewer
    than twice: nothing to compare). With fewer than `2 × window` steps, each end is half of them."""
    steps = sorted(set(experiences.column("step").to_pylist()))
    size = min(window, len(steps) // 2)
    training = []
    first, last = steps[:size], steps[-size:] if size else []
    if size:
        training = [
            Change(name, window_mean(stats, first), window_mean(stats, last))
            for name, stats in reward_series(experiences).items()
        ]
    evaluated = {}
    for taskset, curves in eval_series(evals).items():
        at = curves["reward"].steps
        if len(at) >= 2:
            changes = [Change(name, stats.mean[0], stats.mean[-1]) for name, stats in curves.items()]
            evaluated[taskset] = (at[0], at[-1], changes)
    if not training and not evaluated:
        return None
    return Learning(first, last, training, evaluated)


def learning_figure(experiences: pa.Table, evals: pa.Table) -> Any:
    """Training reward and its parts (e.g. a tool-call rate) per step, and each eval taskset's reward and
    parts at the steps it was evaluated: whether, and how fast, the loop learned."""
    curves = eval_series(evals)
    figure, axes = new_figure(1 + len(curves), "learning: reward and its parts against step")
    for name, stats in reward_series(experiences).items():
        axes[0].plot(stats.steps, stats.mean, marker=".", label=f"train {name}")
    axes[0].set_title("training rollouts (mean per step)")
    for ax, (taskset, parts) in zip(axes[1:], curves.items(), strict=True):
        for name, stats in parts.items():
            ax.plot(stats.steps, stats.mean, marker="o", label=f"eval {name}")
        ax.set_title(f"eval: {taskset}")
        ax.legend(fontsize="small")
    for ax in axes:
        ax.set_xlabel("step")
    legend_below(figure, axes[0])
    return figure


def write_learning(run_dir: Path) -> tuple[Learning | None, Path | None]:
    """Measure the run's before and after and draw `RUN_DIR/learning.png`; (None, None) when there is
    nothing to compare."""
    experiences, evals = read_experiences(run_dir), read_eval(run_dir)
    found = measure(experiences, evals)
    if found is None:
        return None, None
    return found, save_png(learning_figure(experiences, evals), Path(run_dir) / FIGURE)
