"""Checks the stack tests with experience ops share: what a run with `reward_std_filter` then
`grpo_advantage` wrote, and what its MLflow run counted, read back from the run dir alone."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
from mlflow import MlflowClient

from operators.sinks.parquet import ParquetSink

OPS = "[{name: reward_std_filter}, {name: grpo_advantage}, {name: pass_rate}]"
FILTERED = "rollout/filtered/reward_std_filter"


def committed(run_dir: Path) -> dict[int, pa.Table]:
    sink = ParquetSink(Path(run_dir) / "experiences")
    return {step: sink.read_step(step) for step in sink.committed_steps()}


def check_whole_groups_with_grpo_advantages(table: pa.Table, repeats: int) -> int:
    """Every written task has all `repeats` runs once (the filter takes whole groups, none failed), rewards
    that differ, and the advantages GRPO gives them; returns how many tasks were written."""
    groups: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for row in table.select(["task_uid", "run_id", "reward", "advantage"]).to_pylist():
        assert row["run_id"] not in groups[row["task_uid"]], row  # each key once
        groups[row["task_uid"]][row["run_id"]] = (row["reward"], row["advantage"])
    for task, runs in groups.items():
        assert sorted(runs) == list(range(repeats)), task
        rewards = [r for r, _ in runs.values()]
        assert max(rewards) > min(rewards), task  # flat groups were filtered
        mean = sum(rewards) / repeats
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (repeats - 1))
        for reward, advantage in runs.values():
            assert advantage is not None and math.isclose(
                advantage, (reward - mean) / (std + 1e-6), abs_tol=1e-4
            )
    return len(groups)


def metric_by_step(tracking_uri: str, run_id: str, name: str) -> dict[int, float]:
    """The metric's value per step; a step logged twice is an error."""
    history = MlflowClient(tracking_uri).get_metric_history(run_id, name)
    steps = [m.step for m in history]
    assert len(steps) == len(set(steps)), f"{name} logged twice at a step: {sorted(steps)}"
    return {m.step: m.value for m in history}
