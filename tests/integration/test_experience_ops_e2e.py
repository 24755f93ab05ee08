"""Experience ops on the real stack (shared engine, Ray Data, Parquet, MLflow, the reference trainer): each
task's repeats run as separate sub-runs, yet the ops see whole groups; what they drop is counted and never
written; the trainer trains on the explorer's advantages and logs its `train/*` metrics into the run."""

from __future__ import annotations

import json

import pytest
from integration_settings import BASE
from ops_checks import FILTERED, OPS, check_whole_groups_with_grpo_advantages, committed, metric_by_step

from pipelines.explore import explore
from schemas.config import load_config

STEPS, BATCH, REPEATS = 3, 4, 4
TRAIN_METRICS = ("loss", "entropy", "kl_to_start", "zero_adv_groups", "lr", "samples", "groups")


@pytest.mark.timeout(600)  # three closed-loop steps with a trainer beside the shared engine
def test_ops_write_whole_groups_with_advantages_count_drops_and_feed_the_trainer(engines, tmp_path):
    overrides = [
        *BASE,
        f"buffer.total_steps={STEPS}",
        f"buffer.explorer_input.taskset.repeat_times={REPEATS}",
        "explorer.max_repeat_times_per_runner=1",  # every sample its own sub-run, spread over runners
        f"buffer.explorer_input.experience_ops={OPS}",
        "synchronizer.sync_method=checkpoint",
        "synchronizer.sync_timeout=120",
    ]
    cfg = load_config(None, overrides)
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines, with_trainer=True)
    steps = committed(summary.run_dir)
    assert sorted(steps) == [1, 2, 3]

    uri, run_id = summary.tracking_uri, summary.mlflow_run_id
    filtered = metric_by_step(uri, run_id, FILTERED)
    written = metric_by_step(uri, run_id, "pipeline/experience_count")
    assert metric_by_step(uri, run_id, "rollout/failed_tasks") == {1: 0.0, 2: 0.0, 3: 0.0}
    assert metric_by_step(uri, run_id, "rollout/filtered/grpo_advantage") == {1: 0.0, 2: 0.0, 3: 0.0}
    for step, table in steps.items():
        tasks = check_whole_groups_with_grpo_advantages(table, REPEATS)
        assert written[step] == len(table) == tasks * REPEATS
        assert filtered[step] + len(table) == BATCH * REPEATS  # every sample written or counted, once
        for info in table.column("info").to_pylist():
            assert json.loads(info)["pass_rate_runs"] == REPEATS
    assert sum(filtered.values()) > 0 and sum(written.values()) > 0  # both paths taken in this run

    train = {f"train/{name}": metric_by_step(uri, run_id, f"train/{name}") for name in TRAIN_METRICS}
    for name in ("train/loss", "train/zero_adv_groups", "train/lr", "train/samples", "train/groups"):
        assert sorted(train[name]) == [1, 2, 3], (name, train[name])
    # the filter left only groups with a preference, and the trainer used the advantages written for them
    assert set(train["train/zero_adv_groups"].values()) == {0.0}
    assert train["train/groups"] == {
        step: len(set(t.column("task_uid").to_pylist())) for step, t in steps.items()
    }
    assert train["train/samples"] == written
    assert set(train["train/lr"].values()) == {2e-4}
    # entropy and KL are measured on the samples trained on: at the steps that had some
    trained = sorted(step for step, n in train["train/samples"].items() if n > 0)
    assert trained and sorted(train["train/entropy"]) == sorted(train["train/kl_to_start"]) == trained
    assert all(value > 0.0 for value in train["train/entropy"].values())
    kl = train["train/kl_to_start"]  # measured at the weights before each update
    assert kl[trained[0]] == pytest.approx(0.0, abs=1e-6)  # the starting weights
    assert all(kl[step] > 0.0 for step in trained[1:])  # one update or more away from them
    assert summary.model_version == STEPS
