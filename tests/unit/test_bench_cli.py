"""`pipelines.bench` without engines: choosing checkpoints, checks, hashes, keys, state, table, plot, CLI."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from unit_factories import make_experience

from operators.engine.checkpoints import CheckpointError, weights_hash, write_checkpoint
from pipelines.bench import main, parse_args
from pipelines.benchmark.identity import taskset_key
from pipelines.benchmark.loop import child_params, mlflow_metrics, result_metrics
from pipelines.benchmark.report import csv_columns, table_rows, write_outputs
from pipelines.benchmark.selection import (
    Candidate,
    Failure,
    check_candidate,
    checkpoint_step,
    select_candidates,
)
from pipelines.benchmark.session import explorer_selection, resolve_tasksets
from pipelines.benchmark.state import BenchState
from schemas.config import DEFAULT_EVAL, DEFAULT_MODEL, load_config
from schemas.errors import InputError
from schemas.experience import EXPERIENCE_SCHEMA

OPTIONS = (
    "--config",
    "--set",
    "--run-dir",
    "--checkpoints",
    "--checkpoint-dir",
    "--include-base",
    "--latest-only",
    "--watch",
    "--timeout",
    "--taskset",
    "--force",
    "--ray-address",
    "--mlflow-uri",
    "--no-progress",
)


def steps_dir(root: Path, steps: list[int]) -> Path:
    for step in steps:
        (root / f"global_step_{step}").mkdir(parents=True)
    (root / "not_a_step").mkdir()
    (root / "global_step_7.partial").mkdir()
    return root


def test_checkpoint_dir_orders_by_number_not_by_name(tmp_path):
    root = steps_dir(tmp_path / "ckpts", [10, 2, 1])
    chosen = select_candidates(checkpoint_dir=root)
    assert [(c.path.name, c.step) for c in chosen] == [
        ("global_step_1", 1),
        ("global_step_2", 2),
        ("global_step_10", 10),
    ]


def test_base_comes_first_as_step_zero_and_latest_only_keeps_the_newest(tmp_path):
    root = steps_dir(tmp_path / "ckpts", [2, 10])
    chosen = select_candidates(checkpoint_dir=root, base=DEFAULT_MODEL, latest_only=True)
    assert [(c.label, c.step, c.is_base) for c in chosen] == [
        ("base", 0, True),
        ("global_step_10", 10, False),
    ]
    assert [c.step for c in select_candidates(checkpoint_dir=root, latest_only=True)] == [10]
    assert select_candidates(checkpoint_dir=tmp_path / "absent") == []


def test_listed_paths_in_any_order_run_by_step_once_each(tmp_path):
    a, b, c = tmp_path / "global_step_30", tmp_path / "checkpoint-5", tmp_path / "final"
    chosen = select_candidates([a, c, b, a, DEFAULT_MODEL], base=DEFAULT_MODEL)
    assert [(x.path, x.step) for x in chosen] == [(DEFAULT_MODEL, 0), (c, 2), (b, 5), (a, 30)]


def test_checkpoint_step_names():
    assert checkpoint_step(Path("x/global_step_12"), 1) == 12
    assert checkpoint_step(Path("checkpoint-500"), 1) == 500
    assert checkpoint_step(Path("step_3"), 9) == 3
    assert checkpoint_step(Path("llama2"), 4) == 4  # a digit glued to a name is not a step


@pytest.fixture
def two_checkpoints(tmp_path, base_tensors):
    """global_step_1 (the base tensors) and global_step_2 (one tensor perturbed)."""
    root = tmp_path / "ckpts"
    first = write_checkpoint(root, 1, base_tensors, DEFAULT_MODEL)
    name = "model.norm.weight"
    second = write_checkpoint(root, 2, {**base_tensors, name: base_tensors[name] * 1.5}, DEFAULT_MODEL)
    return first, second


def test_weights_hash_follows_the_bytes_and_caches_by_stat(tmp_path, two_checkpoints):
    first, second = two_checkpoints
    copy = shutil.copytree(first, tmp_path / "copy")
    assert weights_hash(first) == weights_hash(copy) != weights_hash(second)
    assert len(weights_hash(first)) == 64
    cache: dict = {}
    value = weights_hash(first, cache)
    assert cache[str(first.resolve())]["sha256"] == value
    cache[str(first.resolve())]["sha256"] = "stale"  # a cache hit is used as is ...
    assert weights_hash(first, cache) == "stale"
    weights = first / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert weights_hash(first, cache) == value  # ... until the file's mtime changes


def test_check_candidate_names_each_problem(tmp_path, two_checkpoints, expected):
    first, _ = two_checkpoints
    check_candidate(Candidate(first, 1), expected, DEFAULT_MODEL)

    def reason(path: Path) -> str:
        with pytest.raises(CheckpointError) as info:
            check_candidate(Candidate(path, 1), expected, DEFAULT_MODEL)
        return str(info.value)

    assert "not found" in reason(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    assert "not a directory" in reason(tmp_path / "file")
    no_model = tmp_path / "no_model"
    no_model.mkdir()
    (no_model / "model.safetensors").write_bytes(b"")
    assert "config.json" in reason(no_model)

    truncated = shutil.copytree(first, tmp_path / "truncated")
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "truncated" in reason(truncated)

    renamed = shutil.copytree(first, tmp_path / "renamed")
    config = json.loads((renamed / "config.json").read_text())
    config["architectures"] = ["MistralForCausalLM"]
    (renamed / "config.json").write_text(json.dumps(config))
    assert "incompatible architecture" in reason(renamed)


def test_other_shapes_are_refused(tmp_path, base_tensors, expected):
    name = "model.norm.weight"
    wrong = write_checkpoint(tmp_path, 3, {**base_tensors, name: torch.zeros(7)}, DEFAULT_MODEL)
    with pytest.raises(CheckpointError, match=name):
        check_candidate(Candidate(wrong, 3), expected, DEFAULT_MODEL)


def test_taskset_key_changes_with_sampling_and_contents(tmp_path, write_jsonl):
    path = write_jsonl([{"prompt": "1+1", "answer": "2"}])
    cfg = load_config(None, [])
    ts = cfg.buffer.explorer_input.taskset.model_copy(update={"name": "t", "path": path})
    key = taskset_key(ts, "eval_math")
    assert taskset_key(ts, "eval_math") == key
    hotter = ts.model_copy(update={"rollout_args": ts.rollout_args.model_copy(update={"temperature": 0.5})})
    assert taskset_key(hotter, "eval_math") != key
    assert taskset_key(ts.model_copy(update={"repeat_times": 8}), "eval_math") != key
    assert taskset_key(ts, "math") != key
    path.write_text(path.read_text() + json.dumps({"prompt": "2+2", "answer": "4"}) + "\n")
    assert taskset_key(ts, "eval_math") != key


def experiences_table(spec: list[tuple[str, list[float]]]):
    import pyarrow as pa

    rows = []
    for uid, accs in spec:
        for run, acc in enumerate(accs):
            e = make_experience(uid, run, reward=acc, reward_parts={"accuracy": acc}, n_tokens=4)
            rows.append(e.to_row())
    return pa.Table.from_pylist(rows, schema=EXPERIENCE_SCHEMA)


def test_result_metrics_from_experiences():
    table = experiences_table([("t/e0/0", [1.0, 0.0]), ("t/e0/1", [0.0, 0.0]), ("t/e0/2", [1.0, 1.0])])
    metrics = result_metrics(table, seconds=2.0, failed_tasks=1)
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["pass_at_k"] == pytest.approx(2 / 3)
    assert metrics["response_length"] == 4.0
    assert metrics["tokens_per_s"] == pytest.approx(6 * 4 / 2.0)
    assert (metrics["failed_tasks"], metrics["num_tasks"]) == (1.0, 4.0)
    assert metrics["accuracy_ci_low"] <= metrics["accuracy"] <= metrics["accuracy_ci_high"]
    named = mlflow_metrics("arith", 2, metrics)
    assert "bench/arith/mean_at_2" in named and "bench/arith/pass_at_2_ci_high" in named
    assert all("@" not in name and "_at_k" not in name for name in named)


def test_state_round_trip_and_replacement(tmp_path):
    state = BenchState(parent_run_id="run1")
    record = {"checkpoint": "c", "step": 1, "weights_hash": "h", "key": "k", "child_run_id": "child"}
    state.put(record)
    state.put({**record, "child_run_id": "child2"})
    state.hash_cache["x"] = {"files": [], "sha256": "y"}
    state.save(tmp_path)
    loaded = BenchState.load(tmp_path)
    assert loaded.parent_run_id == "run1" and len(loaded.records) == 1
    assert loaded.find("h", "k")["child_run_id"] == "child2"
    assert loaded.find("h", "other") is None
    assert loaded.child_of(Path("c"), "h") == "child2"
    assert loaded.hash_cache == state.hash_cache
    assert not list(tmp_path.glob("*.partial"))


def test_table_markdown_and_plot(tmp_path):
    metrics = result_metrics(
        experiences_table([("t/e0/0", [1.0, 0.0]), ("t/e0/1", [0.0, 1.0])]), seconds=1.0, failed_tasks=0
    )
    records = [
        {"checkpoint": f"/c/global_step_{s}", "step": s, "weights_hash": f"{s}" * 64, "taskset": "arith"}
        | {"k": 2, "metrics": metrics}
        for s in (10, 2)
    ]
    bad = Failure(Candidate(Path("/c/broken"), 5), "no config.json | oops")
    rows = table_rows(records, [bad])
    assert [(r["step"], r["status"]) for r in rows] == [(2, "ok"), (5, "failed"), (10, "ok")]
    outputs = write_outputs(rows, tmp_path)
    with outputs["table"].open() as f:
        read = list(csv.DictReader(f))
    assert list(read[0]) == csv_columns()
    assert [r["step"] for r in read] == ["2", "5", "10"] and read[1]["reason"] == "no config.json | oops"
    markdown = outputs["markdown"].read_text()
    assert markdown.count("\n") == 2 + 3
    assert "failed: no config.json \\| oops" in markdown and "k=2:" in markdown
    assert outputs["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_with_nothing_but_failures(tmp_path):
    outputs = write_outputs(table_rows([], [Failure(Candidate(Path("x"), 1), "gone")]), tmp_path)
    assert outputs["plot"].stat().st_size > 0


def test_child_params_skip_what_the_run_already_has(tmp_path):
    cfg = load_config(None, [])
    tasksets = resolve_tasksets(cfg, [])
    params = child_params(Candidate(DEFAULT_MODEL, 0, True), "h" * 64, tasksets, {})
    assert params["weights_hash"] == "h" * 64 and params["step"] == 0
    assert params["checkpoint"] == str(DEFAULT_MODEL.resolve())
    assert (
        params["sampling.arith_eval.temperature"] == 1.0 and params["sampling.arith_eval.repeat_times"] == 4
    )
    again = child_params(Candidate(DEFAULT_MODEL, 0, True), "h" * 64, tasksets, {k: "" for k in params})
    assert again == {}


def test_tasksets_from_option_config_or_bundled(tmp_path, write_jsonl):
    cfg = load_config(None, ["buffer.explorer_input.taskset.repeat_times=2"])
    [bundled] = resolve_tasksets(cfg, [])
    assert (bundled.name, bundled.path, bundled.repeat_times) == ("arith_eval", DEFAULT_EVAL, 2)
    path = write_jsonl([{"prompt": "1+1", "answer": "2"}], name="small.jsonl")
    assert [t.name for t in resolve_tasksets(cfg, [path])] == ["small"]
    with pytest.raises(InputError, match="share a name"):
        resolve_tasksets(cfg, [path, path])
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"buffer": {"explorer_input": {"eval_tasksets": [{"name": "mine"}]}}}))
    assert [t.name for t in resolve_tasksets(load_config(config), [])] == ["mine"]


def test_explorer_selection_honours_both_flags():
    def chosen(*overrides: str):
        s = explorer_selection(load_config(None, list(overrides)), Path("ckpts"))
        return s.include_base, s.latest_only

    assert chosen() == (True, False)  # defaults: eval_on_startup, every checkpoint
    assert chosen("explorer.bench_on_latest_checkpoint=true") == (True, True)  # base and latest
    assert chosen("explorer.eval_on_startup=false", "explorer.bench_on_latest_checkpoint=true") == (
        False,
        True,
    )


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert [o for o in OPTIONS if o not in text] == []


def test_parse_args(tmp_path):
    args = parse_args(["--checkpoints", "b", "a", "--taskset", "x.jsonl", "--taskset", "y.jsonl", "--force"])
    assert args.checkpoints == [Path("b"), Path("a")] and args.tasksets == [Path("x.jsonl"), Path("y.jsonl")]
    assert args.force and not args.watch and args.checkpoint_dir is None
    with pytest.raises(SystemExit):
        parse_args(["--watch"])  # nothing to watch


def test_bad_input_exits_2_before_any_engine(tmp_path, capsys, write_jsonl):
    run = ["--run-dir", str(tmp_path / "run")]
    assert main(run) == 2
    assert "nothing to benchmark" in capsys.readouterr().err
    assert main([*run, "--checkpoint-dir", str(tmp_path / "absent")]) == 2
    assert "checkpoint directory not found" in capsys.readouterr().err
    bad = write_jsonl([{"prompt": "1+1"}], name="bad.jsonl")
    assert main([*run, "--include-base", "--taskset", str(bad)]) == 2
    assert f"{bad}:1, field 'answer'" in capsys.readouterr().err
    assert main([*run, "--include-base", "--set", "model.model_path=/nowhere"]) == 2
    assert "model directory not found" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
