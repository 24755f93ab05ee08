"""The bundled reasoning-gym config (`pipelines/reasoning_gym.yaml`) through the whole pipeline on the shared
engine: generated tasks stream like a file's rows, each experience carries its task's `info`, and the family's
own scorer gives the reward."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from integration_settings import BASE

from operators.rollout.reasoning_gym_reward import reasoning_gym_score
from pipelines.explore import explore
from schemas.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "pipelines" / "reasoning_gym.yaml"
STEPS, BATCH, REPEATS = 2, 4, 2  # BATCH, REPEATS: as in BASE


def test_the_bundled_config_runs_chain_sum_scored_by_its_family_with_its_info(engines, tmp_path):
    cfg = load_config(CONFIG, [*BASE, f"buffer.total_steps={STEPS}"])
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines)
    rows = pq.read_table(summary.run_dir / "experiences").to_pylist()
    assert len(rows) == STEPS * BATCH * REPEATS
    assert len({(r["task_uid"], r["run_id"]) for r in rows}) == len(rows)
    for row in rows:
        task_info = json.loads(row["info"])["task"]
        assert task_info["dataset"] == "chain_sum" and task_info["dataset_args"]["max_terms"] == 2
        # the reward is the family's verdict on what the engine sampled, given the task's info
        assert row["reward"] == reasoning_gym_score(row["response_text"], row["truth"], task_info)["reward"]
    assert len({r["task_uid"] for r in rows}) == STEPS * BATCH  # 64 generated tasks: 8 of them, each once
