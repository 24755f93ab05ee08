"""A GSM8K-style Trinity-RFT GRPO config, as a migrating user brings it, run end to end on the real stack.

`TRINITY_MODEL_PATH` points at the bundled tiny model and `TRINITY_TASKSET_PATH` at a local Hugging Face
dataset folder (a `main` subset with `train` and `test` splits, GSM8K's `question`/`answer` columns and
`#### N` answers) built from the bundled arithmetic taskset. `mode: both` runs the explorer with the reference
trainer (`--with-trainer`); then the same config with `mode: bench` benchmarks the checkpoints it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from mlflow import MlflowClient

from pipelines.explore import bench, explore
from schemas.config import DEFAULT_EVAL, DEFAULT_MODEL, DEFAULT_TRAIN, load_config

CONFIG = """\
project: trinity-e2e
name: gsm8k-grpo
mode: both
checkpoint_root_dir: ${oc.env:TRINITY_CHECKPOINT_ROOT_DIR,./checkpoints}
algorithm:
  algorithm_type: grpo
  repeat_times: 2
  optimizer: {lr: 2.0e-4}
model:
  model_path: ${oc.env:TRINITY_MODEL_PATH}
  max_response_tokens: 12
cluster: {node_num: 1, gpu_per_node: 1}
buffer:
  batch_size: 4
  total_steps: 2
  explorer_input:
    taskset:
      name: gsm8k
      storage_type: file
      path: ${oc.env:TRINITY_TASKSET_PATH}
      subset_name: main
      split: train
      format: {prompt_key: question, response_key: answer}
    eval_tasksets:
      - name: gsm8k_test
        storage_type: file
        path: ${buffer.explorer_input.taskset.path}
        subset_name: main
        split: test
        format: {prompt_key: question, response_key: answer}
    default_workflow_type: math_workflow
    default_reward_fn_type: math_reward
  trainer_input:
    experience_buffer: {name: gsm8k_buffer, storage_type: queue}
explorer:
  eval_interval: 100
  rollout_model: {engine_num: 1, tensor_parallel_size: 1}
synchronizer:
  sync_method: nccl
  sync_interval: 1
  sync_timeout: 120
trainer: {save_interval: 1}
"""


def gsm8k_folder(root: Path, rows: int = 24) -> Path:
    """`root/main/{train,test}-00000-of-00001.parquet` with GSM8K's columns, from the arithmetic tasksets."""
    for split, source in (("train", DEFAULT_TRAIN), ("test", DEFAULT_EVAL)):
        records = [json.loads(line) for line in source.read_text().splitlines()[:rows]]
        table = pa.table(
            {
                "question": [r["prompt"] for r in records],
                "answer": [f"Work it out step by step.\n#### {r['answer']}" for r in records],
            }
        )
        (root / "main").mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / "main" / f"{split}-00000-of-00001.parquet")
    return root


@pytest.mark.timeout(600)
def test_a_gsm8k_trinity_grpo_config_runs_end_to_end_then_benches_its_checkpoints(
    engines, tmp_path, monkeypatch
):
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(DEFAULT_MODEL))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(gsm8k_folder(tmp_path / "gsm8k")))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpts"))
    config = tmp_path / "gsm8k.yaml"
    config.write_text(CONFIG)
    cfg = load_config(config, ["ray.num_cpus=4"])
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines, with_trainer=True)

    table = pq.read_table(summary.run_dir / "experiences")
    assert table.num_rows == 2 * 4 * 2 == summary.experiences  # steps x batch x algorithm.repeat_times
    assert set(table.column("taskset").to_pylist()) == {"gsm8k"}
    truths = table.column("truth").to_pylist()
    assert all("#### " in t for t in truths)  # GSM8K's answers, scored by their final number
    assert 0.0 < sum(table.column("reward").to_pylist()) < table.num_rows  # the tiny model: some right
    checkpoints = tmp_path / "ckpts" / "trinity-e2e" / "gsm8k-grpo"
    assert (checkpoints / "global_step_2").is_dir()  # the reference trainer, at the translated dir

    # the environment's values are recorded as their references, never as the values
    saved = (summary.run_dir / "config.yaml").read_text()
    assert "${oc.env:TRINITY_MODEL_PATH}" in saved and str(tmp_path) not in saved
    params = MlflowClient(summary.tracking_uri).get_run(summary.mlflow_run_id).data.params
    assert params["model.model_path"] == "${oc.env:TRINITY_MODEL_PATH}"
    assert not any(str(tmp_path) in value for value in params.values())

    tree = yaml.safe_load(CONFIG)
    tree["mode"] = "bench"
    config.write_text(yaml.safe_dump(tree))
    bench_cfg = load_config(config, ["ray.num_cpus=4"])
    assert bench_cfg.mode == "bench"
    assert bench(bench_cfg, tmp_path / "bench", progress=False, engines=engines)
    rows = (tmp_path / "bench" / "bench_results.csv").read_text().splitlines()[1:]
    # the base (Trinity's eval_on_startup default) and each checkpoint with other weights than one already
    # measured: on 2 samples a task the tiny model's groups often agree, so GRPO may leave the weights as
    # they were, and a copy is measured once
    steps = {int(row.split(",")[0]) for row in rows}
    assert 0 in steps and steps <= {0, 1, 2} and all(",gsm8k_test," in row and ",ok," in row for row in rows)
