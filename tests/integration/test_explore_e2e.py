"""End to end on the real stack: Ray Data, a vLLM CPU engine actor, Parquet and MLflow."""

from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from pipelines.explore import explore
from schemas.config import load_config

STEPS, BATCH, REPEAT = 2, 4, 3
STEP_METRICS = (
    "rollout/reward/mean",
    "rollout/reward/max",
    "rollout/reward/min",
    "rollout/response_length/mean",
    "rollout/tokens_per_s",
    "pipeline/experience_count",
    "time/rollout_tail",
    "rollout/idle_ratio",
    "rollout/wasted_tokens",
    "rollout/skipped_tasks",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = load_config(
        None,
        [
            f"buffer.total_steps={STEPS}",
            f"buffer.batch_size={BATCH}",
            f"buffer.explorer_input.taskset.repeat_times={REPEAT}",
            "ray.num_cpus=4",
        ],
    )
    summary = explore(cfg, tmp_path_factory.mktemp("run") / "explore", progress=False)
    return summary, pq.read_table(summary.run_dir / "experiences")


def test_experience_count_is_steps_times_batch_times_repeats(run):
    summary, table = run
    assert table.num_rows == STEPS * BATCH * REPEAT == summary.experiences
    assert sorted(set(table.column("step").to_pylist())) == [1, 2]
    assert len(set(table.column("uid").to_pylist())) == table.num_rows


def test_tokens_and_logprobs_line_up(run):
    _, table = run
    for row in table.select(["response_ids", "logprobs", "prompt_ids"]).to_pylist():
        assert row["response_ids"] and row["prompt_ids"]
        assert len(row["logprobs"]) == len(row["response_ids"])
        assert all(lp <= 0.0 for lp in row["logprobs"])


def test_rewards_in_unit_interval(run):
    _, table = run
    low, high = pc.min_max(table.column("reward")).values()
    assert 0.0 <= low.as_py() <= high.as_py() <= 1.0


def test_mlflow_run_has_every_metric_at_every_step(run):
    summary, _ = run
    client = MlflowClient(summary.tracking_uri)
    for name in STEP_METRICS:
        steps = [m.step for m in client.get_metric_history(summary.mlflow_run_id, name)]
        assert sorted(steps) == [1, 2], name
    idle = [m.value for m in client.get_metric_history(summary.mlflow_run_id, "rollout/idle_ratio")]
    # measured between commits: steps overlap (no sync here), so a step may commit with its work done earlier
    assert all(0.0 <= v <= 1.0 for v in idle) and min(idle) < 1.0
    params = client.get_run(summary.mlflow_run_id).data.params
    assert params["buffer.batch_size"] == str(BATCH)
    samples = [f.path for f in client.list_artifacts(summary.mlflow_run_id, "samples")]
    assert samples == ["samples/step_000001.json", "samples/step_000002.json"]
