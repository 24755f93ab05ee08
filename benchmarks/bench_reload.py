"""Seconds per checkpoint: one engine start and an in-place reload each, against a restart per checkpoint.

Both sides run `pipelines.bench.benchmark`, the code behind `python -m pipelines.bench`, in one process on
the same checkpoints and eval taskset:

- reload: one call over every checkpoint: the engine starts once with the base model, then each checkpoint
  is loaded in place and evaluated;
- restart: one call per checkpoint with that checkpoint as the config's model (`--include-base`): each
  starts an engine on it, evaluates it and stops the engine.

Each side's figure is its wall time (Ray already up, MLflow and the outputs included) divided by the number
of checkpoints. The checkpoints are the model's tensors with one tensor scaled per version, written the way a
trainer writes them. The ratio restart / reload is how many times faster the in-place path is; it grows with
the number of checkpoints, since the reload side pays its one start once.

    python benchmarks/bench_reload.py [--checkpoints 3] [--tasks 16] [--set model.model_path=/tmp/llama-100m]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from common import bench_config, parser


def parse_args() -> argparse.Namespace:
    options = parser(
        __doc__,
        tasks=(16, "eval tasks, from the bundled eval set"),
        repeat=(2, "samples per task"),
        out=None,
    )
    options.add_argument("--checkpoints", type=int, default=3, help="checkpoints to benchmark (default 3)")
    return options.parse_args()


def make_checkpoints(model: Path, root: Path, count: int) -> list[Path]:
    """`global_step_1..count`, each with the first linear weight scaled differently (distinct hashes)."""
    from safetensors.torch import load_file

    from operators.engine.checkpoints import weight_files, write_checkpoint

    state: dict = {}
    for path in weight_files(model):
        state.update(load_file(str(path)))
    name = next(n for n in state if n.endswith("mlp.down_proj.weight"))
    return [
        write_checkpoint(root, step, {**state, name: state[name] * (1 + 0.05 * step)}, model)
        for step in range(1, count + 1)
    ]


def main() -> None:
    args = parse_args()
    from pipelines.benchmark.selection import Selection
    from pipelines.benchmark.session import benchmark
    from pipelines.control.runtime import init_ray
    from schemas.config import DEFAULT_EVAL

    cfg = bench_config(args, "buffer.batch_size=8")
    work = Path(tempfile.mkdtemp(prefix="bench-reload-"))
    try:
        taskset = work / "eval.jsonl"
        taskset.write_text("".join(DEFAULT_EVAL.read_text().splitlines(keepends=True)[: args.tasks]))
        checkpoints = make_checkpoints(Path(cfg.model.model_path), work / "ckpts", args.checkpoints)
        init_ray(cfg.ray)  # outside both timings

        started = time.perf_counter()
        report, _ = benchmark(
            cfg.model_copy(deep=True),
            work / "reload",
            Selection(checkpoints=checkpoints),
            taskset_paths=[taskset],
            progress=False,
        )
        reload_s = time.perf_counter() - started
        assert report.ok and len(report.evaluated) == len(checkpoints), report.failures

        restart_each = []
        for i, path in enumerate(checkpoints):
            one = cfg.model_copy(deep=True)
            one.model.model_path = path
            started = time.perf_counter()
            report, _ = benchmark(
                one,
                work / f"restart-{i}",
                Selection(include_base=True),
                taskset_paths=[taskset],
                progress=False,
            )
            restart_each.append(time.perf_counter() - started)
            assert report.ok and len(report.evaluated) == 1, report.failures
        restart_s = sum(restart_each)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    n = len(checkpoints)
    results = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "model": str(cfg.model.model_path),
        "checkpoints": n,
        "eval": f"{args.tasks} tasks x {args.repeat}",
        "reload_total_s": reload_s,
        "reload_s_per_checkpoint": reload_s / n,
        "restart_each_s": restart_each,
        "restart_s_per_checkpoint": restart_s / n,
        "ratio_restart_over_reload": restart_s / reload_s,
    }
    print(
        f"{n} checkpoints, eval {args.tasks} tasks x {args.repeat}, model {Path(cfg.model.model_path).name}\n"
        f"  in-place reload: {reload_s / n:6.1f} s per checkpoint ({reload_s:.1f} s, one engine start)\n"
        f"  restart each:    {restart_s / n:6.1f} s per checkpoint ({restart_s:.1f} s, {n} engine starts)\n"
        f"  ratio restart / reload: {restart_s / reload_s:.2f}x"
    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
