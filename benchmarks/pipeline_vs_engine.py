"""Generated tokens/s through the full explore pipeline vs direct `AsyncLLM` calls, same prompts and sampling.

Both sides exclude engine start-up. By default the pipeline runs as a user runs it: `explore` starts its own
engines, Ray Data's pool starts and imports while they load, and the pipeline's clock starts when the engines
are ready (`EngineFleet.ready_at`). With `--shared-engines` the script starts the engines first (warm once
ready) and the clock starts at the call, so the pool's start (about 4 s on 2 cores) is timed too. The pipeline
is reported end to end (from the clock's start until every step is committed and the run closed, before its
shutdown) and warm, over steps 2..N (from step 1's commit to the last, read from the run's `time/step`
metric), and the time from the clock's start to the first committed step. Targets (#17): warm ratio >= 0.80
with the tiny model (`--tasks 1024 --batch-size 64`), end to end >= 0.95 with the 113M random model
(`--set model.model_path=/tmp/llama-100m`, built by `benchmarks/make_random_model.py`), first commit <= 5 s
after engines-ready.

`--curriculum` also runs, in the same round, the same steps over two tasksets (the bundled graded arithmetic
under `difficulty_based`, the arithmetic taskset under `shuffle`), each step's tasks drawn by the driver as
the feedback they depend on commits, and prints its warm rate against the single one's, before the CPU line:
`curriculum: ratio=X.XX (target >= 0.95; feedback_lag L)` (#44). Its lag, unless `--set` gives one, lets as
many steps be in flight as the single taskset's run has (`curriculum_config`).

Each round also prints the CPU milliseconds per task of each process role (the driver, the step gate, the
forwarders, the engine actor, vLLM's engine core, Ray's own processes) on both sides, over each side's timed
window, and the pipeline's own: its total less the direct side's. The last line is
`pipeline_cpu: ms_per_task=X.XX (target <= half of the figure before #46)` (medians of the rounds).

A fresh engine's speed varies by up to 13% from one instance to the next on a 2-core machine (measured: four
direct runs of the same tasks in one process), more than the gaps the targets are about. `--rounds N` runs N
rounds of (direct, pipeline), each on fresh engines and a fresh Ray, prints each round, and takes the headline
from the medians of the per-round ratios.

    python benchmarks/pipeline_vs_engine.py [--tasks 256] [--repeat 4] [--max-tokens 16] [--shared-engines]
                                            [--rounds 1] [--curriculum]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import bench_config, first_tasks, in_process_engine, parser, start_fleet
from process_cpu import TreeCpu  # a sibling module: CPU seconds by process role


def parse_args() -> argparse.Namespace:
    options = parser(
        __doc__,
        tasks=(256, "tasks (prompts) per side"),
        repeat=(4, "samples per prompt (repeat_times / n)"),
        max_tokens=(16, "max generated tokens per sample"),
        batch_size=(32, "tasks per step in the pipeline"),
    )
    options.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of (direct, pipeline), each on fresh engines; the headline: medians of the rounds",
    )
    options.add_argument(
        "--shared-engines",
        action="store_true",
        help="start and warm the engines before the call and time the pipeline from the call (its pool's "
        "start included) rather than from engines-ready inside a call that starts its own",
    )
    options.add_argument(
        "--curriculum",
        action="store_true",
        help="also run two tasksets with difficulty_based, and print its warm rate against the single one's",
    )
    return options.parse_args()


def curriculum_config(cfg):
    """The same run over two tasksets: the bundled graded arithmetic under `difficulty_based`, and the
    config's own taskset under `shuffle`, both with its sampling and repeats.

    Its feedback lag, unless `--set` gives one, lets as many steps be in flight as the single taskset's run
    has (`runner_per_model` batches per engine, a step each): step N drawn from the feedback of steps up to
    N - runner_per_model. The config's default lag (the sync interval, 1) keeps two steps in flight, which on
    the tiny model leaves the engine short of requests at each step's end (0.76 of the single taskset)."""
    from schemas.config import ASSETS, validate_tree

    tree = cfg.model_dump(mode="json")
    inputs = tree["buffer"]["explorer_input"]
    if inputs["feedback_lag"] is None:
        inputs["feedback_lag"] = cfg.explorer.runner_per_model - 1
    single = inputs.pop("taskset")
    graded = dict(single, name="graded", path=str(ASSETS / "tasksets" / "arith_graded" / "train.jsonl"))
    graded["data_selector"] = {
        "selector_type": "difficulty_based",
        "feature_keys": ["weak_pass", "strong_pass"],
        "kwargs": {"target_reward": 0.5, "tau": 0.1},
    }
    inputs["tasksets"] = [graded, dict(single, data_selector={"selector_type": "shuffle"})]
    return validate_tree(tree, "the curriculum benchmark")


def throughput_config(args: argparse.Namespace):
    """The run both sides serve: `--tasks` in whole steps, no sample rollouts logged."""
    return bench_config(args, "monitor.sample_rollouts=0")


CPU_BEFORE_MS = 1.10  # the pipeline's own CPU ms per task before #46 (docs/PERFORMANCE.md, 2026-12-07)
CPU_SAMPLE_S = 1.0  # the CPU sampler's period; each side's window is bounded by samples of its own


def cpu_in_window(cpu: TreeCpu, before: dict[str, float]) -> dict[str, float]:
    """CPU seconds by role since the `before` sample."""
    after = cpu.now()
    return {role: seconds - before.get(role, 0.0) for role, seconds in after.items()}


async def direct(cfg, tasks, in_flight: int) -> tuple[int, float, dict[str, float]]:
    """Requests straight into an in-process AsyncLLM, with as many in flight as the pipeline allows; also
    the CPU seconds each process role spent in the timed window."""
    from operators.engine.client import sampling_params
    from operators.engine.seeds import derive_seed
    from operators.workflows.single_turn import task_messages

    engine = in_process_engine(cfg)
    try:
        prompts = [engine.prompts.render_chat(task_messages(t)) for t in tasks]
        params = [
            sampling_params(
                t.rollout_args, t.repeat_times, derive_seed(t.rollout_args.get("seed"), t.task_uid, 0)
            )
            for t in tasks
        ]
        await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts[:8], params[:8], strict=True)))
        gate = asyncio.Semaphore(in_flight)

        async def one(prompt: list[int], sampling: dict) -> dict:
            async with gate:
                return await engine.generate(prompt, sampling)

        cpu = TreeCpu(CPU_SAMPLE_S).start()
        before, started = cpu.now(), time.perf_counter()
        outs = await asyncio.gather(*(one(p, s) for p, s in zip(prompts, params, strict=True)))
        seconds = time.perf_counter() - started
        cpu_s = cpu_in_window(cpu, before)
        cpu.stop()
    finally:
        await engine.shutdown()
    return sum(len(s["response_ids"]) for o in outs for s in o["samples"]), seconds, cpu_s


@dataclass
class ExploreRun:
    """What a finished explore run's own records say about its throughput."""

    experiences: Any  # the committed experiences, a pa.Table
    tokens: int  # generated tokens, all steps
    warm_tokens: int  # generated tokens of steps 2..N
    warm_seconds: float  # from step 1's commit to the last (the sum of `time/step` over steps 2..N)
    # wall-clock times (time.time()) the first and the last step's metrics were logged, at their commits
    first_commit: float
    last_commit: float


def read_run(run_dir: Path, tracking_uri: str, run_id: str) -> ExploreRun:
    """Tokens from the committed experiences, times from the run's `time/step` metric in MLflow."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from mlflow import MlflowClient

    table = pq.read_table(Path(run_dir) / "experiences")
    lengths = pc.list_value_length(table.column("response_ids"))
    history = MlflowClient(tracking_uri).get_metric_history(run_id, "time/step")
    return ExploreRun(
        experiences=table,
        tokens=pc.sum(lengths).as_py(),
        warm_tokens=pc.sum(pc.filter(lengths, pc.greater(table.column("step"), 1))).as_py() or 0,
        warm_seconds=sum(m.value for m in history if m.step > 1),
        first_commit=min(m.timestamp for m in history) / 1000,
        last_commit=max(m.timestamp for m in history) / 1000,
    )


@dataclass
class PipelineTimes:
    """The pipeline side's clock: started at engines-ready (or at the call, `--shared-engines`)."""

    run: ExploreRun
    seconds: float  # from the clock's start until explore() returned: every step committed, the run closed
    first_commit: float  # from the clock's start to step 1's commit
    engine_start: float  # from the call to engines-ready (0 with shared engines, started before the call)
    shutdown: float  # the explorer's shutdown after that (engines it started stopped), not timed above
    cpu: dict[str, float]  # CPU seconds by process role from engines-ready until every step was committed


async def run_explorer(explorer, cpu: TreeCpu) -> tuple[float, float, dict[str, float]]:
    """(wall-clock time every step was committed and the run closed, seconds its shutdown took, CPU
    seconds by role from the engines ready to then)."""
    try:
        await explorer.prepare()
        before = cpu.now()
        await explorer.explore()
        done = time.time()
        cpu_s = cpu_in_window(cpu, before)
    finally:
        closing = time.perf_counter()
        await explorer.shutdown()
    return done, time.perf_counter() - closing, cpu_s


def pipeline(cfg, run_dir: Path, shared: bool) -> PipelineTimes:
    """The full explore run, on engines it starts itself, or on engines started and warmed before it."""
    from pipelines.control.explorer import Explorer
    from pipelines.control.runtime import init_ray

    init_ray(cfg.ray)
    engines = start_fleet(cfg, "bench") if shared else None  # ready, so warm (`VLLMEngine.warm_up`)
    cpu = TreeCpu(CPU_SAMPLE_S).start()
    try:
        explorer = Explorer(cfg, run_dir, progress=False, engines=engines)
        called = time.time()
        done, shutdown, cpu_s = asyncio.run(run_explorer(explorer, cpu))
    finally:
        cpu.stop()
        if engines is not None:
            engines.stop()
    clock = called if shared else explorer.fleet.ready_at
    run = read_run(explorer.run_dir, explorer.tracking_uri, explorer.state.mlflow_run_id)
    return PipelineTimes(run, done - clock, run.first_commit - clock, clock - called, shutdown, cpu_s)


def cpu_table(direct_cpu: dict[str, float], pipe_cpu: dict[str, float], tasks: int) -> dict[str, Any]:
    """CPU milliseconds per task by process role on each side, and the pipeline's own: its total less the
    direct side's (the same requests, the same engine work)."""
    per_task = {
        role: {
            "direct": round(1000 * direct_cpu.get(role, 0.0) / tasks, 3),
            "pipeline": round(1000 * pipe_cpu.get(role, 0.0) / tasks, 3),
        }
        for role in sorted({*direct_cpu, *pipe_cpu})
    }
    own = 1000 * (sum(pipe_cpu.values()) - sum(direct_cpu.values())) / tasks
    return {"cpu_ms_per_task_by_role": per_task, "pipeline_cpu_ms_per_task": round(own, 3)}


def print_cpu_table(table: dict[str, Any]) -> None:
    print(f"{'CPU ms per task':<46} {'direct':>8} {'pipeline':>9}")
    for role, sides in table["cpu_ms_per_task_by_role"].items():
        print(f"  {role:<44} {sides['direct']:>8.3f} {sides['pipeline']:>9.3f}")
    own = "the pipeline's own (its total less direct)"
    print(f"  {own:<44} {'':>8} {table['pipeline_cpu_ms_per_task']:>9.3f}")


def one_round(args: argparse.Namespace, cfg, tasks) -> dict[str, Any]:
    """The direct side, then the pipeline, each on an engine of its own; Ray is shut down after, so the
    next round starts as this one did."""
    import ray  # heavy, deferred: as the other imports of the sides

    in_flight = cfg.explorer.runner_per_model * cfg.buffer.batch_size * cfg.explorer.rollout_model.engine_num
    direct_tokens, direct_s, direct_cpu = asyncio.run(direct(cfg, tasks, in_flight))
    curriculum, curriculum_cfg = None, curriculum_config(cfg) if args.curriculum else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            times = pipeline(cfg, Path(tmp) / "bench", args.shared_engines)
        if args.curriculum:
            ray.shutdown()  # as the single-taskset run started: a fresh Ray and engine
            with tempfile.TemporaryDirectory() as tmp:
                curriculum = pipeline(curriculum_cfg, Path(tmp) / "curriculum", args.shared_engines)
    finally:
        ray.shutdown()
    run, pipe_s, first_commit = times.run, times.seconds, times.first_commit
    pipe_tokens, warm_tokens, warm_s = run.tokens, run.warm_tokens, run.warm_seconds
    direct_rate, pipe_rate, warm_rate = direct_tokens / direct_s, pipe_tokens / pipe_s, warm_tokens / warm_s
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "tasks": len(tasks),
        "requests_in_flight": in_flight,
        "clock_starts_at": "the call (shared engines)" if args.shared_engines else "engines ready",
        "repeat": args.repeat,
        "max_tokens": args.max_tokens,
        "direct_tokens": direct_tokens,
        "direct_s": round(direct_s, 2),
        "direct_tokens_per_s": round(direct_rate, 1),
        "pipeline_tokens": pipe_tokens,
        "pipeline_s": round(pipe_s, 2),
        "pipeline_tokens_per_s": round(pipe_rate, 1),
        "pipeline_warm_tokens_per_s": round(warm_rate, 1),
        "ratio_end_to_end": round(pipe_rate / direct_rate, 3),
        "ratio_warm": round(warm_rate / direct_rate, 3),
        "first_commit_s": round(first_commit, 2),
        "pipeline_engine_start_s": round(times.engine_start, 2),
        "pipeline_shutdown_s": round(times.shutdown, 2),
        **cpu_table(direct_cpu, times.cpu, len(tasks)),
    }
    if curriculum is not None:
        rate = curriculum.run.warm_tokens / curriculum.run.warm_seconds
        result["curriculum_warm_tokens_per_s"] = round(rate, 1)
        result["ratio_curriculum"] = round(rate / warm_rate, 3)
        result["curriculum_feedback_lag"] = curriculum_cfg.buffer.explorer_input.feedback_lag
    print(json.dumps(result, indent=2), flush=True)
    print_cpu_table(result)
    return result


def main() -> None:
    args = parse_args()
    cfg = throughput_config(args)
    tasks = first_tasks(cfg, args.tasks)
    rounds = [one_round(args, cfg, tasks) for _ in range(max(1, args.rounds))]
    each = {key: [r[key] for r in rounds] for key in ("ratio_warm", "ratio_end_to_end", "first_commit_s")}
    warm, end_to_end, first_commit = (statistics.median(values) for values in each.values())
    if len(rounds) > 1:
        print(f"{len(rounds)} rounds: {json.dumps(each)}")
    median = "medians of the rounds; " if len(rounds) > 1 else ""
    print(
        f"pipeline_vs_engine: ratio={warm:.2f} (target warm >= 0.80 with the tiny model; end to end "
        f"{end_to_end:.2f}, target >= 0.95 with the 113M model; first commit {first_commit:.1f} s (<= 5); "
        f"{median}clock from {rounds[0]['clock_starts_at']})"
    )
    cpu_ms = statistics.median(r["pipeline_cpu_ms_per_task"] for r in rounds)
    if args.curriculum:
        ratio = statistics.median(r["ratio_curriculum"] for r in rounds)
        lag = rounds[0]["curriculum_feedback_lag"]
        print(f"curriculum: ratio={ratio:.2f} (target >= 0.95; feedback_lag {lag})")
    print(
        f"pipeline_cpu: ms_per_task={cpu_ms:.2f} (target <= {CPU_BEFORE_MS / 2:.2f}, half of the "
        f"{CPU_BEFORE_MS:.2f} measured before #46; {median}all roles less the direct side's)"
    )


if __name__ == "__main__":
    main()
