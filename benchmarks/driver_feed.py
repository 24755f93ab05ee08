"""How many GPU engines one driver can keep fed: the most tasks per second the driver, the step gate, the
forwarders and the sink sustain, measured with STAND-IN engines (`stand_in_engine.py`) that answer after a
fixed delay with fixed tokens, then divided by what one real engine gets through.

A real run's explore (`pipelines.explore.explore`, default Parquet sink and MLflow store, the task's own
workflow and reward) runs on `--engines` stand-ins plugged in through `EngineFleet(launch=...)`. Without
weight syncs every step is released at once, so from the first request on the pipeline has a backlog and runs
as fast as it can: the sustained rate is every task over the time from the first request a stand-in receives
to the last step's commit (the wall-clock stamp MLflow puts on that step's metrics). Start-up (Ray Data's
pool, the MLflow run) is left out; the pool's ramp and one stand-in delay are in, so the rate errs low. A
stand-in waits `--delay` per request and any number of requests may wait at once, so the engines are never
the limit (the JSON's `stand_in_ceiling_tasks_per_s` is the rate the in-flight window allows; the measured
rate should be far below it).

Per-engine rate: a published vLLM output throughput for a 7B model on one H100 (`--engine-tokens-per-s`,
default 3281 tokens/s: Mistral-7B-Instruct-v0.3, 1x H100-80GB-SXM, 320 prompts, vLLM 0.5.4; Lambda's vLLM
benchmark, https://github.com/LambdaLabsML/vllm-benchmark/blob/main/benchmark_v0.md), divided by the tokens
one task generates (`--repeat` samples x `--response-tokens`). Engines supported = sustained tasks/s / per-
engine tasks/s; the target is 64 engines from one driver, so ratio = engines / 64.

    python benchmarks/driver_feed.py [--engines 8] [--steps 31] [--batch-size 64] [--repeat 8]
                                     [--response-tokens 512] [--delay 1.0] [--engine-tokens-per-s 3281]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import stand_in_engine  # a sibling module: the stand-in engine actor
from common import bench_config, parser, start_fleet
from process_cpu import DRIVER, GATE, TreeCpu  # a sibling module: CPU seconds by role

TARGET_ENGINES = 64
PUBLISHED_TOKENS_PER_S = 3281.19  # Lambda's vLLM benchmark: Mistral-7B-Instruct-v0.3, 1x H100-80GB-SXM
PUBLISHED_SOURCE = (
    "Mistral-7B-Instruct-v0.3 on 1x H100-80GB-SXM, vLLM 0.5.4, 320 prompts: "
    "https://github.com/LambdaLabsML/vllm-benchmark/blob/main/benchmark_v0.md"
)


def parse_args() -> argparse.Namespace:
    options = parser(
        __doc__,
        steps=(31, "steps (31 x 64: the bundled taskset's 2000 tasks, whole steps)"),
        batch_size=64,
        repeat=8,
    )
    options.add_argument("--engines", type=int, default=8, help="stand-in engines (and so forwarders)")
    options.add_argument("--response-tokens", type=int, default=512, help="tokens in each stand-in sample")
    options.add_argument("--prompt-tokens", type=int, default=256, help="prompt ids each answer reports")
    options.add_argument("--delay", type=float, default=1.0, help="seconds a stand-in takes per request")
    options.add_argument(
        "--engine-tokens-per-s",
        type=float,
        default=PUBLISHED_TOKENS_PER_S,
        help="generated tokens/s of one real engine (default: the published figure in the module doc)",
    )
    return options.parse_args()


def driver_feed_config(args: argparse.Namespace):
    return bench_config(
        args,
        f"explorer.rollout_model.engine_num={args.engines}",
        "explorer.rollout_model.engine_cpus=0.01",  # the stand-ins reserve no CPU (see `stand_in_fleet`)
        "explorer.rollout_model.device=cpu",
        f"ray.num_cpus={max(8, args.engines)}",  # logical: room for the forwarders (0.25 each) and reads
    )


def stand_in_fleet(cfg, shape: stand_in_engine.StandInShape):
    """An `EngineFleet` whose engines are stand-ins, started under the engines' names."""
    import ray

    from operators.actors.names import NAMESPACE

    ray.cloudpickle.register_pickle_by_value(stand_in_engine)  # Ray workers cannot import benchmarks/
    actor = ray.remote(stand_in_engine.StandInEngine)

    def launch(name: str, closed: bool):
        return actor.options(name=name, namespace=NAMESPACE, num_cpus=0, max_concurrency=100_000).remote(
            shape
        )

    return start_fleet(cfg, "driver-feed", launch)


def measure(cfg, args: argparse.Namespace, run_dir: Path) -> dict:
    import ray

    from operators.actors.names import NAMESPACE
    from pipelines.explore import explore

    shape = stand_in_engine.StandInShape(args.delay, args.prompt_tokens, args.response_tokens)
    fleet = stand_in_fleet(cfg, shape)
    try:
        started, cpu = time.perf_counter(), TreeCpu().start()
        summary = explore(cfg, run_dir, progress=False, engines=fleet)
        seconds, cpu_s = time.perf_counter() - started, cpu.stop()
        requests = fleet.counters().get("stand_in_requests", 0.0)
        stand_ins = [ray.get_actor(name, namespace=NAMESPACE) for name in fleet.names]
        first_request = min(
            t for t in ray.get([s.first_request.remote() for s in stand_ins]) if t is not None
        )
    finally:
        fleet.stop()
    tasks, commits = committed(summary, args.repeat)
    window = max(commits) - first_request
    in_window = cpu.between(first_request, max(commits))
    return {
        "tasks": tasks,
        "failed_tasks": summary.failed_tasks,
        "stand_in_requests": int(requests),
        "end_to_end_s": round(seconds, 2),
        "end_to_end_tasks_per_s": round(tasks / seconds, 2),
        "cpu_s_whole_run": round(sum(cpu_s.values()), 1),
        # CPU by role within the sustained window, per task (the driver: every thread of this process: the
        # committer, MLflow, Ray Data's executor). On a cluster the forwarders and sink writers spread over
        # the nodes; the driver and the step gate stay one process each.
        "cpu_ms_per_task": {role: round(1000 * v / tasks, 2) for role, v in sorted(in_window.items())},
        "cpu_ms_per_task_total": round(1000 * sum(in_window.values()) / tasks, 2),
        "first_commit_after_first_request_s": round(min(commits) - first_request, 2),
        "sustained_window_s": round(window, 2),
        "sustained_tasks_per_s": round(tasks / window, 2),
    }


def committed(summary, repeat: int) -> tuple[int, list[float]]:
    """Tasks committed (from the Parquet sink) and each step's commit time (the wall-clock stamp MLflow put
    on its `time/step` metric when the step committed)."""
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    rows = pq.read_table(summary.run_dir / "experiences", columns=["step"]).num_rows
    history = MlflowClient(summary.tracking_uri).get_metric_history(summary.mlflow_run_id, "time/step")
    return rows // repeat, [m.timestamp / 1000 for m in history]


def engines_per_core(ms_per_task: float | None, engine_tasks_per_s: float) -> float | None:
    """Engines one process could feed with a whole core, by its CPU per task (None when not seen)."""
    return round(1000 / ms_per_task / engine_tasks_per_s, 1) if ms_per_task else None


def main() -> None:
    args = parse_args()
    cfg = driver_feed_config(args)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(cfg, args, Path(tmp) / "driver-feed")
    tokens_per_task = args.repeat * args.response_tokens
    per_engine = args.engine_tokens_per_s / tokens_per_task
    engines = result["sustained_tasks_per_s"] / per_engine
    in_flight = args.engines * cfg.explorer.runner_per_model * args.batch_size
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "stand_in_engines": args.engines,
        "delay_s": args.delay,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "response_tokens": args.response_tokens,
        "prompt_tokens": args.prompt_tokens,
        "stand_in_ceiling_tasks_per_s": round(in_flight / args.delay, 1),
        **result,
        "engine_tokens_per_s": args.engine_tokens_per_s,
        "engine_source": PUBLISHED_SOURCE if args.engine_tokens_per_s == PUBLISHED_TOKENS_PER_S else "given",
        "tokens_per_task": tokens_per_task,
        "engine_tasks_per_s": round(per_engine, 4),
        "engines_supported": round(engines, 1),
        # What one whole core for each of the two single processes would sustain, by their CPU per task
        **{
            f"engines_per_{name}_core": engines_per_core(result["cpu_ms_per_task"].get(role), per_engine)
            for name, role in (("driver", DRIVER), ("gate", GATE))
        },
    }
    print(json.dumps(result, indent=2))
    print(
        f"per engine: {args.engine_tokens_per_s:g} tokens/s / {tokens_per_task} tokens per task "
        f"({args.repeat} x {args.response_tokens}) = {per_engine:.3f} tasks/s; "
        f"{result['sustained_tasks_per_s']} tasks/s sustained / {per_engine:.3f} = {engines:.1f} engines"
    )
    if result["stand_in_requests"] < result["tasks"]:
        print("warning: fewer stand-in requests than tasks: the run did not go through the stand-ins")
    print(
        f"driver_feed: ratio={engines / TARGET_ENGINES:.2f} (target >= 1.00: {TARGET_ENGINES} engines from "
        f"one driver), engines={math.floor(engines)}"
    )


if __name__ == "__main__":
    sys.exit(main())
