"""Partial rollout through the whole pipeline on the shared engine: with `synchronizer.partial_rollout` the
next period's tasks start before a sync, the sync cuts them, and they go on under the new weights. What
commits says so token by token, each task once, within the staleness bound."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from integration_settings import BASE
from mlflow import MlflowClient

from pipelines.explore import explore
from schemas.config import load_config

PLUGINS = Path(__file__).resolve().parents[1] / "length_plugins"
STEPS, SHORT, LONG = 4, 8, 200
OVERRIDES = [
    f"buffer.total_steps={STEPS}",
    "buffer.explorer_input.taskset.default_workflow_type=alternating_lengths",
    f"buffer.explorer_input.taskset.workflow_args={{short: {SHORT}, long: {LONG}}}",
    "synchronizer.sync_method=memory",
    "synchronizer.sync_offset=0",
    "synchronizer.max_staleness=2",
    "synchronizer.sync_timeout=120",
    "synchronizer.partial_rollout=true",
]


def test_a_sync_cuts_the_next_steps_generations_which_commit_with_both_versions(engines, tmp_path):
    cfg = load_config(None, [*BASE, *OVERRIDES])
    cfg.plugin_dirs = [PLUGINS]
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines, with_trainer=True)
    client = MlflowClient(summary.tracking_uri)

    def total(name: str) -> float:
        return sum(m.value for m in client.get_metric_history(summary.mlflow_run_id, name))

    rows = pq.read_table(summary.run_dir / "experiences").to_pylist()
    assert len(rows) == STEPS * 4 * 2  # every task of every step, once
    assert len({(r["task_uid"], r["run_id"]) for r in rows}) == len(rows)
    assert total("rollout/preempted") > 0
    continued = [r for r in rows if len(set(r["token_versions"])) > 1]
    # Which generations a sync finds in flight depends on how fast the engine samples against how fast the
    # trainer trains: step 4 (long, started at the sync after step 2) is usually cut by the sync after short
    # step 3, but on a loaded machine it may finish first, or a short step may be cut instead. What partial
    # rollout promises is that a generation in flight at a sync is cut and goes on: some were, and each
    # continuation below is whole and versioned token by token.
    assert continued
    for row in continued:
        versions = row["token_versions"]
        assert versions == sorted(versions)  # the old version's tokens first, then the new one's
        assert row["model_version"] == versions[0]  # a continuation counts by its oldest token
        # ignore_eos: a continuation has its step's whole length (a short step's task may be cut too, when
        # a sync lands while it samples on a loaded machine)
        assert len(row["response_ids"]) == len(versions) == (LONG if row["step"] % 2 == 0 else SHORT)
    assert (
        max(m.value for m in client.get_metric_history(summary.mlflow_run_id, "rollout/staleness/max")) <= 2
    )
    assert total("rollout/stale_dropped") == 0
    assert summary.model_version >= STEPS - 1
