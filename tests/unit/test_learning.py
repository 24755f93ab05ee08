"""The before and after of a closed-loop run (`pipelines.report_lib.learning`), on hand-made experience
tables: the training ends are means of per-step means, each eval taskset goes from its first evaluation to
its last, and the figure is a PNG with the right panels."""

from __future__ import annotations

import pytest
from unit_factories import make_experience

from pipelines.report_lib.learning import learning_figure, measure
from pipelines.report_lib.plots import png_bytes
from schemas.experience import EXPERIENCE_SCHEMA, experiences_to_table


def training_table(rewards_per_step: list[list[float]]):
    """Experiences of steps 1..N, each step's rewards as given; `called` is 1 where the reward is."""
    return experiences_to_table(
        [
            make_experience(
                f"t/e0/{step}",
                run,
                step=step,
                reward=reward,
                reward_parts={"accuracy": reward, "called": float(reward > 0)},
            )
            for step, rewards in enumerate(rewards_per_step, start=1)
            for run, reward in enumerate(rewards)
        ]
    )


def eval_table(accuracy_at: dict[int, list[float]]):
    return experiences_to_table(
        [
            make_experience(
                f"e/e0/{i}", 0, step=step, taskset="held_out", reward=r, reward_parts={"accuracy": r}
            )
            for step, rewards in accuracy_at.items()
            for i, r in enumerate(rewards)
        ]
    )


def test_each_end_is_the_mean_of_its_steps_means():
    # 12 steps: the first five have rewards (0, 0) ... then steps with (1, 0) and (1, 1); a step with more
    # samples does not weigh more
    steps = [[0.0, 0.0]] * 5 + [[1.0, 0.0]] * 2 + [[1.0, 1.0, 1.0, 0.0]] * 5
    found = measure(training_table(steps), eval_table({0: [0.0, 0.0], 6: [1.0, 0.0], 12: [1.0, 1.0]}))
    assert found.first_steps == [1, 2, 3, 4, 5] and found.last_steps == [8, 9, 10, 11, 12]
    training = {c.name: c for c in found.training}
    assert training["reward"].before == 0.0 and training["reward"].after == pytest.approx(0.75)
    assert training["called"].rise == pytest.approx(0.75)
    first, last, changes = found.evals["held_out"]
    assert (first, last) == (0, 12)
    assert {c.name: (c.before, c.after) for c in changes}["accuracy"] == (0.0, 1.0)
    text = found.render()
    assert "steps 1-5 -> steps 8-12" in text and "eval held_out, step 0 -> step 12" in text
    assert "0.000 -> 0.750 (+0.750)" in text


def test_a_short_run_compares_its_halves_and_one_eval_is_no_comparison():
    found = measure(training_table([[0.0], [0.0], [1.0], [1.0]]), eval_table({0: [0.5]}))
    assert found.first_steps == [1, 2] and found.last_steps == [3, 4]
    assert found.training[0].rise == 1.0
    assert found.evals == {}


def test_nothing_to_compare_is_none():
    assert measure(training_table([[1.0]]), EXPERIENCE_SCHEMA.empty_table()) is None


def test_the_figure_has_a_training_panel_and_one_per_eval_taskset():
    figure = learning_figure(training_table([[0.0], [1.0]]), eval_table({0: [0.0], 2: [1.0]}))
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles == ["training rollouts (mean per step)", "eval: held_out"]
    assert png_bytes(figure).startswith(b"\x89PNG")
