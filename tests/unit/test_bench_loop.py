"""The benchmark loop without engines: skip, fail and go on, watch, MLflow child runs (real, on SQLite).

Two test doubles stand in for the engine-facing parts only: `FleetDouble` (the `Fleet` protocol: loads are
recorded, not made) and `RecordingBench.eval_double` (the `evaluate` function: it returns one stand-in
experience per task instead of running the taskset). Checks, hashing, state, resume, watching, MLflow, the
table and the plot are the real code.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from unit_factories import make_results

import pipelines.benchmark.loop as loop_module
from operators.engine.checkpoints import weights_hash, write_checkpoint
from pipelines.benchmark.loop import Bench, run_benchmark
from pipelines.benchmark.report import PLOT_PNG, TABLE_CSV
from pipelines.benchmark.selection import Selection
from pipelines.benchmark.state import BenchState
from pipelines.control.evaluate import Evaluation
from pipelines.control.fleet import Loaded, Restore, WeightUpdate
from pipelines.control.tracking import MlflowMonitor, default_tracking_uri
from schemas.config import DEFAULT_MODEL, load_config
from schemas.status import flatten_experiences

METRICS = {
    "accuracy": 0.5,
    "accuracy_ci_low": 0.25,
    "accuracy_ci_high": 0.75,
    "mean_at_k": 0.5,
    "mean_at_k_ci_low": 0.25,
    "mean_at_k_ci_high": 0.75,
    "pass_at_k": 1.0,
    "pass_at_k_ci_low": 1.0,
    "pass_at_k_ci_high": 1.0,
    "response_length": 3.0,
    "response_length_ci_low": 3.0,
    "response_length_ci_high": 3.0,
    "tokens_per_s": 100.0,
    "failed_tasks": 0.0,
    "num_tasks": 2.0,
}


class FleetDouble:
    """Test double of the `Fleet` protocol: records the versions it is asked to load."""

    names: list[str] = []
    restarts = 0
    error = None
    group_backend = "gloo"

    def __init__(self) -> None:
        self.loads: list[int] = []
        self.adapters: list[tuple[int, str, dict]] = []  # a LoRA run's loads: version, folder name, probe
        self.restore_point = Restore(0, path=DEFAULT_MODEL)

    def load(self, update: WeightUpdate, timeout: float) -> Loaded:
        self.loads.append(update.version)
        if update.adapter is not None:
            self.adapters.append((update.version, update.path.name, update.adapter.probe))
        self.restore_point = update.restore_point()
        return Loaded(0.0, 0)

    def get_weight(self, name: str) -> Any:
        raise NotImplementedError

    def open_weight_group(self, address: str, port: int, timeout: float) -> None:
        raise NotImplementedError


@dataclass
class RecordingBench(Bench):
    """The real `Bench`, given the doubles; `on_eval` lets a test act as a trainer during an eval."""

    recorder: FleetDouble = field(default_factory=FleetDouble)
    evals: list[tuple[int, str]] = field(default_factory=list)
    on_eval: dict[int, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.evaluate = self.eval_double

    @property
    def loads(self) -> list[int]:
        return self.recorder.loads

    def eval_double(self, cfg, fleet, taskset, plan, step: int, out: Path) -> Evaluation:
        self.evals.append((step, taskset.name))
        if step in self.on_eval:
            self.on_eval.pop(step)()
        records = make_results([(f"{taskset.name}/e0/0", step, 2)])
        return Evaluation(taskset, flatten_experiences(records), records, 1.0)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> tuple[str, Path]:
    """One SQLite store for the module (creating one costs seconds); each test has its own parent run."""
    root = tmp_path_factory.mktemp("mlflow")
    MlflowMonitor(default_tracking_uri(root), "bench-test", "warm-up", root / "mlartifacts")
    return default_tracking_uri(root), root / "mlartifacts"


@pytest.fixture
def setup(tmp_path, base_tensors, expected, write_jsonl, tracking):
    taskset = write_jsonl([{"prompt": "1+1", "answer": "2"}], name="small.jsonl")
    cfg = load_config(None, ["buffer.explorer_input.taskset.repeat_times=2"])
    cfg.buffer.explorer_input.eval_tasksets = [
        cfg.buffer.explorer_input.taskset.model_copy(update={"name": "small", "path": taskset})
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monitor = MlflowMonitor(tracking[0], "bench-test", "parent", tracking[1])
    ckpts = tmp_path / "ckpts"
    name = "model.norm.weight"

    def checkpoint(step: int) -> Path:
        return write_checkpoint(
            ckpts, step, {**base_tensors, name: base_tensors[name] * (step + 1)}, DEFAULT_MODEL
        )

    def make(config=cfg, **kwargs) -> RecordingBench:
        state = BenchState.load(run_dir)
        recorder = FleetDouble()
        kwargs.setdefault("fleet", recorder)
        return RecordingBench(
            config, run_dir, parent=monitor, state=state, plans=defaultdict(type(None)), expected=expected,
            recorder=recorder, **kwargs,
        )  # fmt: skip

    return {
        "make": make, "checkpoint": checkpoint, "ckpts": ckpts, "monitor": monitor, "run_dir": run_dir,
        "cfg": cfg,
    }  # fmt: skip


def children(monitor: MlflowMonitor) -> list:
    experiment = monitor.client.get_run(monitor.run_id).info.experiment_id
    return monitor.client.search_runs([experiment], f"tags.mlflow.parentRunId = '{monitor.run_id}'")


def test_each_checkpoint_once_then_skipped_and_a_copy_is_skipped_too(setup, tmp_path):
    import shutil

    for step in (1, 10, 2):
        setup["checkpoint"](step)
    bench = setup["make"](loaded_hash=weights_hash(DEFAULT_MODEL))
    report = run_benchmark(bench, Selection(checkpoint_dir=setup["ckpts"], include_base=True), progress=False)
    assert bench.evals == [(0, "small"), (1, "small"), (2, "small"), (10, "small")]
    assert bench.loads == [1, 2, 10]  # the engines already held the base: no load for it
    assert report.ok and len(report.evaluated) == 4 and len(children(setup["monitor"])) == 4
    history = setup["monitor"].client.get_metric_history(setup["monitor"].run_id, "bench/small/mean_at_2")
    assert [m.step for m in history] == [0, 1, 2, 10]
    assert (setup["run_dir"] / TABLE_CSV).is_file() and (setup["run_dir"] / PLOT_PNG).is_file()

    copy = shutil.copytree(setup["ckpts"] / "global_step_2", tmp_path / "copy_of_2")
    again = setup["make"]()
    report = run_benchmark(
        again,
        Selection([copy], setup["ckpts"], include_base=True),
        progress=False,
        restore=Restore(0, path=DEFAULT_MODEL),
    )
    assert again.evals == [] and again.loads == [] and len(report.skipped) == 5
    assert len(children(setup["monitor"])) == 4


def test_engines_start_on_first_need_only(setup):
    setup["checkpoint"](1)
    started: list[int] = []

    def start() -> FleetDouble:
        started.append(1)
        return first.recorder

    first = setup["make"](fleet=None, start_fleet=start)
    run_benchmark(first, Selection(checkpoint_dir=setup["ckpts"], include_base=True), progress=False)
    assert started == [1] and first.loads == [1]  # started on the base: only step 1 is loaded
    rerun = setup["make"](fleet=None, start_fleet=start)
    report = run_benchmark(rerun, Selection(checkpoint_dir=setup["ckpts"], include_base=True), progress=False)
    assert started == [1] and len(report.skipped) == 2  # nothing new: no engine start


def test_force_measures_again_in_new_child_runs(setup):
    setup["checkpoint"](1)
    run_benchmark(setup["make"](), Selection(checkpoint_dir=setup["ckpts"]), progress=False)
    forced = setup["make"](force=True)
    run_benchmark(forced, Selection(checkpoint_dir=setup["ckpts"]), progress=False)
    assert forced.evals == [(1, "small")] and len(children(setup["monitor"])) == 2


def test_a_changed_sampling_setting_is_measured_again_in_the_same_child(setup):
    setup["checkpoint"](1)
    run_benchmark(setup["make"](), Selection(checkpoint_dir=setup["ckpts"]), progress=False)
    cooler = setup["make"]()
    [ts] = cooler.cfg.buffer.explorer_input.eval_tasksets
    args = ts.rollout_args.model_copy(update={"temperature": 0.5})
    cooler.cfg.buffer.explorer_input.eval_tasksets = [
        ts.model_copy(update={"name": "cool", "rollout_args": args})
    ]
    run_benchmark(cooler, Selection(checkpoint_dir=setup["ckpts"]), progress=False)
    assert cooler.evals == [(1, "cool")]
    [child] = children(setup["monitor"])
    assert child.data.params["sampling.cool.temperature"] == "0.5"
    assert child.data.params["sampling.small.temperature"] == "1.0"


def test_failures_are_reported_and_the_rest_go_on(setup, tmp_path):
    good = setup["checkpoint"](3)
    broken = setup["checkpoint"](4)
    (broken / "config.json").unlink()
    bench = setup["make"]()
    selection = Selection([tmp_path / "missing", broken, good])
    report = run_benchmark(bench, selection, progress=False)
    assert bench.evals == [(3, "small")]
    reasons = {f.candidate.path.name: f.reason for f in report.failures}
    assert "not found" in reasons["missing"] and "no config.json" in reasons["global_step_4"]
    assert not report.ok
    statuses = [(r["step"], r["status"]) for r in report.rows]
    assert statuses == [(1, "failed"), (3, "ok"), (4, "failed")]  # 'missing' has no number: position 1


def test_an_eval_that_raises_fails_that_checkpoint_only(setup):
    for step in (1, 2):
        setup["checkpoint"](step)
    bench = setup["make"]()

    def boom() -> None:
        raise RuntimeError("engine died")

    bench.on_eval[1] = boom
    report = run_benchmark(bench, Selection(checkpoint_dir=setup["ckpts"]), progress=False)
    assert [f.candidate.step for f in report.failures] == [1]
    assert "engine died" in report.failures[0].reason
    assert [c.step for c in report.evaluated] == [2]
    statuses = {c.data.params["step"]: c.info.status for c in children(setup["monitor"])}
    assert statuses == {"1": "FAILED", "2": "FINISHED"}


def test_watch_picks_up_new_checkpoints_until_the_trainer_stops(setup, monkeypatch, base_tensors):
    monkeypatch.setattr(loop_module, "WATCH_POLL_S", 0.0)
    setup["checkpoint"](1)
    ckpts = setup["ckpts"]
    bench = setup["make"]()

    def trainer_writes_more() -> None:  # while step 1 is evaluated, the trainer writes step 2 and a partial 3
        setup["checkpoint"](2)
        partial = setup["checkpoint"](3)
        data = (partial / "model.safetensors").read_bytes()
        (partial / "model.safetensors").write_bytes(data[: len(data) // 2])
        (ckpts / "trainer_status.json").write_text(json.dumps({"state": "stopped", "version": 3}))

    bench.on_eval[1] = trainer_writes_more
    report = run_benchmark(bench, Selection(checkpoint_dir=ckpts, watch=True, timeout=600), progress=False)
    assert bench.evals == [(1, "small"), (2, "small")]
    assert [f.candidate.step for f in report.failures] == [3] and "truncated" in report.failures[0].reason


def test_watch_ends_at_the_timeout(setup, monkeypatch):
    monkeypatch.setattr(loop_module, "WATCH_POLL_S", 0.0)
    bench = setup["make"]()
    report = run_benchmark(
        bench, Selection(checkpoint_dir=setup["ckpts"], watch=True, timeout=0.0), progress=False
    )
    assert report.ok and bench.evals == []


def test_latest_only_when_watching_takes_the_newest(setup, monkeypatch):
    monkeypatch.setattr(loop_module, "WATCH_POLL_S", 0.0)
    for step in (1, 5, 3):
        setup["checkpoint"](step)
    (setup["ckpts"] / "trainer_status.json").write_text(json.dumps({"state": "stopped"}))
    bench = setup["make"]()
    run_benchmark(
        bench, Selection(checkpoint_dir=setup["ckpts"], latest_only=True, watch=True), progress=False
    )
    assert bench.evals == [(5, "small")]


def test_a_symlink_loop_is_that_checkpoint_s_failure_and_the_others_go_on(setup, tmp_path):
    good = setup["checkpoint"](3)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    bench = setup["make"]()
    report = run_benchmark(bench, Selection([loop, good]), progress=False)
    assert bench.evals == [(3, "small")]
    [failure] = report.failures
    assert failure.candidate.path == loop and "symlink loop" in failure.reason


def test_a_looping_weight_file_in_the_checkpoint_dir_fails_that_checkpoint_only(setup):
    broken, _ = setup["checkpoint"](1), setup["checkpoint"](2)
    for weights in broken.glob("*.safetensors"):  # found under --checkpoint-dir: its files are resolved
        weights.unlink()
        weights.symlink_to(weights)
    bench = setup["make"]()
    report = run_benchmark(bench, Selection(checkpoint_dir=setup["ckpts"]), progress=False)
    assert bench.evals == [(2, "small")]
    [failure] = report.failures
    assert failure.candidate.path == broken and "symlink loop" in failure.reason


def test_a_lora_run_benchmarks_adapters_as_versions_on_the_same_engines(setup, tmp_path):
    """With `model.lora`, each checkpoint is an adapter loaded as the version of its step, with its probe; an
    adapter the engines cannot serve is reported naming its file, and the others go on."""
    from safetensors.numpy import save_file

    from schemas.lora_config import LoraConfig

    probe = {"token_ids": [0, 5, 6], "logprobs": [-1.0, -2.0]}

    def adapter(name: str, rank: int) -> Path:
        folder = tmp_path / "adapters" / name
        folder.mkdir(parents=True)
        config = {"r": rank, "target_modules": ["q_proj"], "base_model_name_or_path": DEFAULT_MODEL.name}
        (folder / "adapter_config.json").write_text(json.dumps(config))
        tensor = np.full((rank, 4), len(name), np.float32)
        save_file(
            {"base_model.model.layers.0.q_proj.lora_A.weight": tensor},
            str(folder / "adapter_model.safetensors"),
        )
        (folder / "adapter_probe.json").write_text(json.dumps(probe))
        return folder

    cfg = setup["cfg"]
    lora_cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"lora": LoraConfig()})})
    bench = setup["make"](config=lora_cfg, loaded_hash=weights_hash(DEFAULT_MODEL))
    chosen = [adapter("global_step_20", 8), adapter("global_step_10", 16), adapter("global_step_30", 64)]
    report = run_benchmark(bench, Selection(chosen, include_base=True), progress=False)
    assert bench.recorder.adapters == [(10, "global_step_10", probe), (20, "global_step_20", probe)]
    assert bench.evals == [(0, "small"), (10, "small"), (20, "small")]  # the base first: no load for it
    [failure] = report.failures
    assert "global_step_30/adapter_config.json" in failure.reason and "max_lora_rank" in failure.reason
