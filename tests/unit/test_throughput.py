"""One throughput, defined once (`pipelines.control.throughput`), checked on recorded steps: a step's rate is
over its own sampling window, the run's over the union of the windows, and the idle ratio is below 1 in a
step that sampled tokens, however close its commit came to the one before."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from unit_factories import make_experience, make_results

from pipelines.control.step_report import StepReporter
from pipelines.control.steps import CommittedStep
from pipelines.control.throughput import BusyClock, sampling_window, union_seconds
from schemas.config import Config
from schemas.experience import experiences_to_table


class Monitor:
    """Test double of `MlflowMonitor`: keeps the logged metrics by step."""

    def __init__(self):
        self.metrics: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics, step):
        self.metrics[step] = metrics

    def log_table(self, table, name):
        pass


def recorded_step(
    step: int, tokens: list[int], runs: list[tuple[float, float]], seconds: float
) -> CommittedStep:
    """A committed step as a run records it: one experience per sub-run, `(start, end)` wall-clock times."""
    experiences = experiences_to_table(
        [  # the first of each step's experiences has two turns
            make_experience(f"t{step}-{i}", 0, step=step, n_tokens=n, turns=2 - bool(i))
            for i, n in enumerate(tokens)
        ]
    )
    records = make_results([(f"t{step}-{i}", step, 1) for i in range(len(runs))])
    ends, lengths = [end for _, end in runs], [end - start for start, end in runs]
    records = records.set_column(records.schema.get_field_index("finished_at"), "finished_at", pa.array(ends))
    records = records.set_column(records.schema.get_field_index("task_run_time"), "task_run_time", [lengths])
    return CommittedStep(step, experiences, records, seconds)


def test_the_sampling_window_runs_from_the_first_start_to_the_last_end():
    step = recorded_step(1, [4, 4], [(10.0, 12.0), (11.0, 15.0)], seconds=9.0)
    assert sampling_window(step.records) == (10.0, 15.0)
    assert union_seconds([(10.0, 15.0), (12.0, 16.0), (20.0, 21.0)]) == 7.0  # an overlap counted once


def test_an_idle_engine_between_two_close_commits_is_not_idle_in_the_step_it_sampled():
    clock = BusyClock(at=10.0, busy=0.0)
    clock.read(14.0, 4.0)  # busy all the way to the first commit
    clock.read(14.05, 4.0)  # nothing in flight between the commits
    assert clock.idle_ratio((10.0, 14.0), engines=1) == 0.0  # was 1.0 over the 0.05 s since the last commit
    assert clock.idle_ratio((12.0, 14.05), engines=2) == pytest.approx(1 - 2.0 / (2.05 * 2))
    assert clock.idle_ratio((14.0, 14.05), engines=1) == 1.0  # no step sampled there


def test_the_reported_rates_agree_with_the_recorded_tokens_and_windows():
    busy = {"busy_s": 0.0}
    monitor = Monitor()
    reporter = StepReporter(Config(), monitor, 16, 2, 1, progress=False, counters=lambda: dict(busy))
    t = time.time() + 0.01  # the windows lie between the reporter's first reading and the commits' readings
    first = recorded_step(1, [30, 10], [(t, t + 0.02), (t + 0.005, t + 0.04)], seconds=50.0)  # 40 tokens
    second = recorded_step(2, [20, 20], [(t + 0.01, t + 0.04), (t + 0.03, t + 0.05)], seconds=0.001)
    time.sleep(0.1)
    busy["busy_s"] = 0.05  # the engine's running total at the commits
    reporter.committed(first, 0)
    reporter.committed(second, 0)
    assert monitor.metrics[1]["rollout/tokens_per_s"] == pytest.approx(40 / 0.04)
    assert monitor.metrics[2]["rollout/tokens_per_s"] == pytest.approx(40 / 0.04)  # not 40 / 0.001
    assert monitor.metrics[2]["time/sampling"] == pytest.approx(0.04)
    assert 0.0 < monitor.metrics[2]["rollout/idle_ratio"] < 1.0  # it sampled 40 tokens
    assert reporter.totals["tokens"] == 80
    assert reporter.totals["multi_turn"] == 2 and reporter.totals["experiences"] == 4  # the summary's counts
    assert reporter.totals["sampling_s"] == pytest.approx(0.05)  # the union: t to t + 0.05
    reporter.close()
