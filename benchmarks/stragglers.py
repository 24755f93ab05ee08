"""Which mode beats the straggler tail: time per step at equal committed experiences, with a weight sync every
step, for five modes side by side on one warm engine:

- sync: `sync_offset: 0` (a step waits for the trainer, the trainer for the step);
- overlap: `sync_offset: 1` (the next step samples while the trainer trains);
- overlap+over_rollout: a step ends once `1 - ratio` of its tasks are done, the rest skipped;
- overlap+partial: a sync cuts the generations in flight, which go on under the new weights;
- all: the three together;
- partial_offset0: partial rollout without the offset, the one way it has room to cut within
  `max_staleness: 1` (the gate caps the early start by the bound; see docs/running.md, "Partial rollout");
- all+recycle and recycle_offset0: over-rollout's cut tasks go on into the next step
  (`explorer.over_rollout.recycle`) with partial rollout, with and without the offset.

The workload has a long tail: every task's response length is drawn lognormal and sampled to the end with
`ignore_eos` (the `bench_long_tail` stand-in workflow in `stragglers_plugins/`). The trainer is a stand-in,
named as one: once step N is committed it sleeps 0.5x the synchronous mode's median step time (measured first,
in a synchronous run whose stand-in publishes at once), then publishes checkpoint N, a hard-linked copy of the
base weights. `max_staleness`
is 1. Step time is the wall time between the first and the last commit over the steps between; at equal
committed experiences it is scaled by the share of a step's experiences committed (over-rollout skips some).
Staleness is `rollout/staleness/max`; waste is `rollout/wasted_tokens` (sampled by requests aborted as stale)
plus `rollout/stale_dropped` (experiences dropped at commit as too stale) and the share over-rollout skipped.

    python benchmarks/stragglers.py [--model DIR] [--steps 6] [--batch-size 16] [--repeat 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from common import bench_config, parser, start_fleet

PLUGINS = Path(__file__).resolve().with_name("stragglers_plugins")
SYNC = [
    "synchronizer.sync_method=checkpoint",
    "synchronizer.max_staleness=1",
    "synchronizer.sync_timeout=120",
]
MODES = {
    "sync": ["synchronizer.sync_offset=0"],
    "overlap": ["synchronizer.sync_offset=1"],
    "overlap+over_rollout": ["synchronizer.sync_offset=1", "explorer.over_rollout.ratio=0.25"],
    "overlap+partial": ["synchronizer.sync_offset=1", "synchronizer.partial_rollout=true"],
    "all": [
        "synchronizer.sync_offset=1",
        "explorer.over_rollout.ratio=0.25",
        "synchronizer.partial_rollout=true",
    ],
    # not one of the five: with `max_staleness: 1` the offset leaves partial rollout no room (the
    # gate starts nothing early), so this shows what partial rollout alone does within the same bound
    "partial_offset0": ["synchronizer.sync_offset=0", "synchronizer.partial_rollout=true"],
    # over-rollout's cut tasks go on into the next step (`recycle`): with the offset they commit one version
    # staler than the bound allows, so they are measured both ways
    "all+recycle": [
        "synchronizer.sync_offset=1",
        "explorer.over_rollout.ratio=0.25",
        "explorer.over_rollout.recycle=true",
        "synchronizer.partial_rollout=true",
    ],
    "recycle_offset0": [
        "synchronizer.sync_offset=0",
        "explorer.over_rollout.ratio=0.25",
        "explorer.over_rollout.recycle=true",
        "synchronizer.partial_rollout=true",
    ],
}


def parse_args() -> argparse.Namespace:
    options = parser(
        __doc__,
        model=None,
        steps=(6, "steps per mode"),
        batch_size=16,
        repeat=(4, "samples per task"),
        max_tokens=(180, "longest response (the draw is clipped; prompt + this must fit 256)"),
    )
    options.add_argument("--median-tokens", type=int, default=20, help="median response length")
    options.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the response length")
    return options.parse_args()


def write_taskset(path: Path, count: int, median: int, sigma: float, longest: int) -> list[int]:
    """`count` tasks whose answer is their response length, lognormal around `median`, in [4, longest]."""
    rng = random.Random(0)
    lengths = [min(longest, max(4, round(rng.lognormvariate(0.0, sigma) * median))) for _ in range(count)]
    path.write_text("".join(json.dumps({"prompt": f"Tell story {i}.", "answer": str(n)}) + "\n"
                            for i, n in enumerate(lengths)))  # fmt: skip
    return lengths


def mode_config(args: argparse.Namespace, taskset: Path, extra: list[str]):
    return bench_config(
        args,
        f"buffer.explorer_input.taskset.path={taskset}",
        "buffer.explorer_input.taskset.default_workflow_type=bench_long_tail",
        f"explorer.rollout_model.max_model_len={args.max_tokens + 64}",
        "monitor.sample_rollouts=0",
        *SYNC,
        *extra,
        plugin_dir=PLUGINS,
    )


class TrainerStandIn(threading.Thread):
    """Stand-in trainer: after step N commits, sleeps `train_s`, then publishes `global_step_N` (hard links to
    the base weights: loading them is a real reload, training is only the sleep). Also times every commit."""

    def __init__(self, run_dir: Path, model: Path, train_s: float, steps: int):
        super().__init__(daemon=True)
        self.run_dir, self.model, self.train_s, self.steps = run_dir, model, train_s, steps
        self.commits: dict[int, float] = {}
        self.done = threading.Event()

    def publish(self, version: int) -> None:
        from schemas.run_dir import checkpoint_dir_name

        root = self.run_dir / "checkpoints"
        staging = root / f".staging-{version}"
        staging.mkdir(parents=True)
        for file in self.model.iterdir():
            if file.is_file():
                os.link(file, staging / file.name)
        staging.rename(root / checkpoint_dir_name(version))

    def run(self) -> None:
        from operators.sinks.parquet import ParquetSink

        sink, version = ParquetSink(self.run_dir / "experiences"), 0
        while not self.done.is_set() and version < self.steps:
            now = time.perf_counter()
            for step in sink.committed_steps() if (self.run_dir / "experiences").is_dir() else []:
                self.commits.setdefault(step, now)
            if version + 1 in self.commits:
                time.sleep(self.train_s)
                version += 1
                self.publish(version)
            time.sleep(0.01)


def run_mode(cfg, run_dir: Path, engines, train_s: float) -> dict[str, float]:
    from mlflow import MlflowClient

    from operators.sinks.parquet import ParquetSink
    from pipelines.explore import explore

    stand_in = TrainerStandIn(run_dir, Path(cfg.model.model_path), train_s, cfg.buffer.total_steps)
    stand_in.start()
    try:
        summary = explore(cfg, run_dir, progress=False, engines=engines)
    finally:
        stand_in.done.set()
        stand_in.join()
    sink = ParquetSink(run_dir / "experiences")
    committed = {s: sink.read_step(s).num_rows for s in sink.committed_steps()}
    times = [stand_in.commits[s] for s in sorted(stand_in.commits)]
    steps = len(times) - 1
    per_step = (times[-1] - times[0]) / steps
    share = statistics.mean(committed.values()) / (
        cfg.buffer.batch_size * cfg.buffer.explorer_input.taskset.repeat_times
    )
    client = MlflowClient(summary.tracking_uri)

    def history(name: str) -> list[float]:
        return [m.value for m in client.get_metric_history(summary.mlflow_run_id, name)]

    return {
        "step_s": round(per_step, 3),
        "committed_share": round(share, 3),
        "step_s_equal_experiences": round(per_step / share, 3),
        "median_step_s": round(statistics.median(b - a for a, b in zip(times, times[1:], strict=False)), 3),
        "staleness_max": max(history("rollout/staleness/max"), default=0.0),
        "wasted_tokens": sum(history("rollout/wasted_tokens")),
        "preempted": sum(history("rollout/preempted")),
        "stale_dropped": sum(history("rollout/stale_dropped")),
        "recycled_tasks": sum(history("rollout/recycled_tasks")),
        "model_version": summary.model_version,
    }


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        taskset = Path(tmp) / "long_tail.jsonl"
        lengths = write_taskset(
            taskset, args.steps * args.batch_size, args.median_tokens, args.sigma, args.max_tokens
        )
        calibrate = mode_config(args, taskset, MODES["sync"])
        engines = start_fleet(calibrate, "bench-stragglers")
        try:
            base = run_mode(calibrate, Path(tmp) / "calibrate", engines, 0.0)  # also warms the engine
            train_s = 0.5 * base["median_step_s"]
            results = {
                name: run_mode(mode_config(args, taskset, extra), Path(tmp) / name, engines, train_s)
                for name, extra in MODES.items()
            }
        finally:
            engines.stop()
    sync_s = results["sync"]["step_s_equal_experiences"]
    ratios = {name: round(r["step_s_equal_experiences"] / sync_s, 3) for name, r in results.items()}
    best = min((n for n in ratios if n != "sync"), key=ratios.get)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "model": str(calibrate.model.model_path),
        "steps": args.steps, "batch_size": args.batch_size, "repeat": args.repeat,
        "lengths": {"min": min(lengths), "median": statistics.median(lengths), "max": max(lengths)},
        "untrained_sync_median_step_s": base["median_step_s"], "trainer_stand_in_s": round(train_s, 3),
        **results,
        "ratio_to_sync": ratios,
    }  # fmt: skip
    print(json.dumps(report, indent=2))
    bound = "within" if results[best]["staleness_max"] <= 1 else "OVER"
    print(
        f"stragglers: ratio={ratios[best]:.2f} (target <= 0.60; best: {best}, staleness {bound} the bound 1)"
    )


if __name__ == "__main__":
    main()
