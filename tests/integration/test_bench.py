"""`python -m pipelines.bench` and `Explorer.benchmark()` on the shared engine actor, with real MLflow.

Checkpoints are the tiny model's own tensors with one tensor scaled, written as `global_step_N/` the way a
trainer writes them. The eval taskset is the first 6 rows of the bundled eval set, 2 samples each.
"""

from __future__ import annotations

import asyncio
import csv
import json
import shutil
from pathlib import Path

import pytest
import ray
from integration_settings import BASE
from mlflow import MlflowClient
from safetensors.torch import load_file

from operators.engine.checkpoints import write_checkpoint
from pipelines.bench import main
from pipelines.benchmark.report import PLOT_PNG, TABLE_CSV, TABLE_MD
from pipelines.control.tracking import default_tracking_uri
from pipelines.explorer import Explorer
from schemas.config import DEFAULT_EVAL, DEFAULT_MODEL, load_config
from schemas.run_dir import BENCH_STATE as STATE_FILE

SCALED = "model.layers.1.mlp.down_proj.weight"
SETTINGS = [f"--set={item}" for item in BASE]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict[str, Path]:
    """A 6-task eval taskset and `global_step_2`, `global_step_10` (perturbed copies of the base)."""
    root = tmp_path_factory.mktemp("bench")
    small = root / "small.jsonl"
    small.write_text("".join(DEFAULT_EVAL.read_text().splitlines(keepends=True)[:6]))
    base = load_file(str(DEFAULT_MODEL / "model.safetensors"))
    for step, factor in ((2, 1.1), (10, 0.8)):
        write_checkpoint(root / "ckpts", step, {**base, SCALED: base[SCALED] * factor}, DEFAULT_MODEL)
    return {"root": root, "small": small, "ckpts": root / "ckpts"}


def bench(engines, run_dir: Path, *args: str) -> int:
    return main([*SETTINGS, "--run-dir", str(run_dir), "--no-progress", *args], engines=engines)


def child_runs(client: MlflowClient, parent_id: str) -> list:
    experiment = client.get_run(parent_id).info.experiment_id
    return client.search_runs([experiment], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")


def engine_version(engines) -> int:
    return ray.get(engines.handles[0].get_model_version.remote())


def test_three_checkpoints_give_child_runs_table_and_plot_then_a_rerun_skips_them(engines, workspace, capsys):
    run_dir = workspace["root"] / "run"
    args = (
        "--include-base",
        "--checkpoint-dir",
        str(workspace["ckpts"]),
        "--taskset",
        str(workspace["small"]),
    )
    assert bench(engines, run_dir, *args) == 0
    out = capsys.readouterr().out
    assert "3 checkpoints evaluated, 0 already done, 0 failed" in out

    state = json.loads((run_dir / STATE_FILE).read_text())
    client = MlflowClient(default_tracking_uri(run_dir))
    parent = state["parent_run_id"]
    children = child_runs(client, parent)
    assert sorted(int(c.data.params["step"]) for c in children) == [0, 2, 10]
    hashes = {c.data.params["weights_hash"] for c in children}
    assert len(hashes) == 3 and all(len(h) == 64 for h in hashes)
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.params["sampling.small.repeat_times"] == "2"
        assert child.data.params["sampling.small.temperature"] == "1.0"
        assert Path(child.data.params["checkpoint"]).is_dir()
        metrics = child.data.metrics
        assert 0.0 <= metrics["bench/small/accuracy_ci_low"] <= metrics["bench/small/accuracy"]
        assert metrics["bench/small/accuracy"] <= metrics["bench/small/accuracy_ci_high"] <= 1.0
        assert {"bench/small/mean_at_2", "bench/small/pass_at_2", "bench/small/response_length"} <= set(
            metrics
        )
        assert metrics["bench/small/tokens_per_s"] > 0 and metrics["bench/small/num_tasks"] == 6
    # one chart on the parent spans every checkpoint, at the checkpoint's step (2 before 10)
    history = client.get_metric_history(parent, "bench/small/accuracy")
    assert sorted(m.step for m in history) == [0, 2, 10]
    assert {m.step for m in client.get_metric_history(parent, "bench/small/pass_at_2_ci_high")} == {0, 2, 10}

    with (run_dir / TABLE_CSV).open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["taskset"], r["status"]) for r in rows] == [
        ("0", "small", "ok"),
        ("2", "small", "ok"),
        ("10", "small", "ok"),
    ]
    assert (run_dir / TABLE_MD).read_text().count("| small |") == 3
    assert (run_dir / PLOT_PNG).read_bytes()[:4] == b"\x89PNG"
    logged = {a.path for a in client.list_artifacts(parent)}
    assert {TABLE_CSV, TABLE_MD, PLOT_PNG} <= logged
    assert len(list((run_dir / "bench").glob("step_*/small.parquet"))) == 3
    assert engine_version(engines) == 0  # shared engines are put back on the base weights

    # a rerun measures nothing again: same records, same child runs, no new points on the chart
    assert bench(engines, run_dir, *args) == 0
    assert "0 checkpoints evaluated, 3 already done, 0 failed" in capsys.readouterr().out
    assert json.loads((run_dir / STATE_FILE).read_text())["records"] == state["records"]
    assert len(child_runs(client, parent)) == 3
    assert len(client.get_metric_history(parent, "bench/small/accuracy")) == 3
    with (run_dir / TABLE_CSV).open() as f:
        assert len(list(csv.DictReader(f))) == 3


def test_bad_checkpoints_are_reported_and_the_others_go_on(engines, workspace, capsys):
    root = workspace["root"]
    corrupt = shutil.copytree(workspace["ckpts"] / "global_step_2", root / "corrupt")
    data = (corrupt / "model.safetensors").read_bytes()
    (corrupt / "model.safetensors").write_bytes(data[: len(data) // 3])
    not_a_model = root / "notes"
    not_a_model.mkdir()
    (not_a_model / "README.txt").write_text("not weights")
    run_dir = root / "run-bad"
    listed = [corrupt, root / "missing", not_a_model, workspace["ckpts"] / "global_step_10"]
    code = bench(engines, run_dir, "--taskset", str(workspace["small"]), "--checkpoints", *map(str, listed))
    assert code == 1
    out = capsys.readouterr().out
    assert "1 checkpoints evaluated, 0 already done, 3 failed" in out
    assert "truncated" in out and "not found" in out and "no config.json" in out

    with (run_dir / TABLE_CSV).open() as f:
        rows = {Path(r["checkpoint"]).name: r for r in csv.DictReader(f)}
    assert rows["global_step_10"]["status"] == "ok" and float(rows["global_step_10"]["num_tasks"]) == 6
    assert {name: rows[name]["status"] for name in ("corrupt", "missing", "notes")} == dict.fromkeys(
        ("corrupt", "missing", "notes"), "failed"
    )
    assert "truncated" in rows["corrupt"]["reason"]
    parent = json.loads((run_dir / STATE_FILE).read_text())["parent_run_id"]
    client = MlflowClient(default_tracking_uri(run_dir))
    assert len(child_runs(client, parent)) == 1  # only the good one gets a run
    assert client.get_run(parent).info.status == "FAILED"
    assert engine_version(engines) == 0


def test_explorer_benchmark_runs_the_base_and_the_latest_when_both_flags_are_set(engines, workspace):
    cfg = load_config(
        None,
        [
            *BASE,
            f"synchronizer.checkpoint_dir={workspace['ckpts']}",
            "explorer.bench_on_latest_checkpoint=true",
            "explorer.eval_on_startup=true",
        ],
    )
    cfg.buffer.explorer_input.eval_tasksets = [
        cfg.buffer.explorer_input.taskset.model_copy(update={"name": "small", "path": workspace["small"]})
    ]
    explorer = Explorer(cfg, workspace["root"] / "explorer", engines=engines, progress=False)

    async def run() -> bool:
        try:
            return await explorer.benchmark()
        finally:
            await explorer.shutdown()

    assert asyncio.run(run()) is True
    state = json.loads((explorer.run_dir / STATE_FILE).read_text())
    assert sorted(r["step"] for r in state["records"]) == [0, 10]
    client = MlflowClient(explorer.tracking_uri)
    history = client.get_metric_history(state["parent_run_id"], "bench/small/accuracy")
    assert sorted(m.step for m in history) == [0, 10]
    assert engine_version(engines) == 0


def test_explorer_benchmark_after_prepare_nests_under_the_explorer_run(engines, workspace):
    cfg = load_config(
        None,
        [
            *BASE,
            f"synchronizer.checkpoint_dir={workspace['ckpts']}",
            "explorer.bench_on_latest_checkpoint=true",
            "explorer.eval_on_startup=false",
        ],
    )
    explorer = Explorer(cfg, workspace["root"] / "prepared", engines=engines, progress=False)

    async def run() -> bool:
        try:
            await explorer.prepare()
            return await explorer.benchmark()
        finally:
            await explorer.shutdown()

    assert asyncio.run(run()) is True
    client = MlflowClient(explorer.tracking_uri)
    [child] = child_runs(client, explorer.monitor.run_id)
    assert child.data.params["step"] == "10" and "bench/arith_eval/accuracy" in child.data.metrics
    assert [
        m.step for m in client.get_metric_history(explorer.monitor.run_id, "bench/arith_eval/accuracy")
    ] == [10]
    assert explorer.config.buffer.explorer_input.eval_tasksets == []  # the bench's tasksets stay its own
    assert engine_version(engines) == 0  # back on the run's version
