"""Multi-turn tokens/s three ways, same tasks, seeds and sampling, in one run:

- direct: a plain in-process loop on `VLLMEngine` (first turn `chat`, later turns `chat_turn`);
- pipeline: `explore` with an `EnvWorkflow` (the stand-in environment in `multi_turn_plugins/`);
- sessions: `explore` with an `AgentWorkflow` making the same turns with a plain `openai` client over the
  engine's OpenAI API, recorded by the engine per session (`operators/engine/sessions.py`).

The environment (named as a stand-in) answers every reply with a fixed observation and ends after 3 turns,
so every trajectory has real turns whatever the model writes. Tokens are the sampled ones (action mask
true). Engine start-up is excluded everywhere. The pipeline sides are measured end to end (their own start-up
included: the headline) and warm, over steps 2..N (their `time/step` metric; steps overlap, so this window
overstates the rate). Targets: pipeline / direct >= 0.85 and sessions / direct >= 0.75 (at 113M, 256 tasks x
2 x 3 turns).

With `--agents` (the `agents` extra, and a model whose chat template renders tool calls, such as the bundled
tiny-fc-llama) it compares instead an OpenAI Agents SDK agent on the Responses API, run by `explore`
(`multi_turn_agents/`), with a direct loop making the same turns: turns 1 and 2 forced to call the stand-in
tool (`tool_choice: required`, held by vLLM's structured outputs; the tool answers the stand-in observation),
turn 3 free. Target: agents / direct >= 0.60. A forced call is 37 tokens of tiny-fc-llama's tokenizer and 57
of the default one's (one a character), so give `--max-tokens 64` or more, or every forced turn is cut short
and the run ends there.

    python benchmarks/multi_turn.py [--model DIR] [--tasks 64] [--repeat 2] [--max-tokens 16] [--agents]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

from common import bench_config, first_tasks, in_process_engine, parser, start_fleet

PLUGINS = Path(__file__).resolve().with_name("multi_turn_plugins")
AGENT_PLUGINS = Path(__file__).resolve().with_name("multi_turn_agents")
AGENT_WORKFLOW = "bench_agents_sdk"
TURNS = 3
OBSERVATION = "Noted. Go on."  # as the stand-in environment's
CALL = re.compile(
    r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL
)  # a forced call, as vLLM's hermes parser reads it


def parse_args() -> argparse.Namespace:
    options = parser(
        __doc__,
        model=None,
        tasks=(64, "tasks per side"),
        repeat=(2, "trajectories per task"),
        max_tokens=(16, "max sampled tokens per turn"),
        batch_size=(16, "tasks per step in the pipeline"),
    )
    options.add_argument(
        "--in-flight",
        type=int,
        help="trajectories the direct loop runs at once (default: a step's, batch size x repeat, as the "
        "pipeline runs them)",
    )
    options.add_argument(
        "--agents",
        action="store_true",
        help="compare the Agents SDK path (Responses API, forced tool turns) with a direct loop forcing them",
    )
    return options.parse_args()


def workflow_config(args: argparse.Namespace, workflow: str):
    return bench_config(
        args,
        f"buffer.explorer_input.taskset.default_workflow_type={workflow}",
        "explorer.rollout_model.enable_openai_api=true",
        "monitor.sample_rollouts=0",
        plugin_dir=PLUGINS,
    )


async def direct(cfg, tasks, in_flight: int) -> tuple[int, float]:
    """Every trajectory side by side on an in-process engine: the loop EnvWorkflow runs, with no pipeline."""
    from operators.engine.client import sampling_params
    from operators.engine.seeds import derive_seed

    engine = in_process_engine(cfg)
    gate = asyncio.Semaphore(in_flight)

    async def trajectory(task, run_id: int) -> int:
        async with gate:
            return await turns(task, run_id)

    async def turns(task, run_id: int) -> int:
        messages, history, sampled = [{"role": "user", "content": task.prompt}], None, 0
        for turn in range(TURNS):
            seed = derive_seed(task.rollout_args.get("seed"), task.task_uid, run_id, turn)
            sampling = sampling_params(task.rollout_args, 1, seed)
            out = await (
                engine.chat(messages, sampling)
                if history is None
                else engine.chat_turn(messages, sampling, history)
            )
            sample = out["samples"][0]
            sampled += len(sample["response_ids"])
            history = [*out["prompt_ids"], *sample["response_ids"]]
            messages += [
                {"role": "assistant", "content": sample["text"]},
                {"role": "user", "content": OBSERVATION},
            ]
        return sampled

    try:
        await asyncio.gather(*(trajectory(t, 0) for t in tasks[:4]))  # warm-up
        started = time.perf_counter()
        counts = await asyncio.gather(*(trajectory(t, r) for t in tasks for r in range(t.repeat_times)))
        seconds = time.perf_counter() - started
    finally:
        await engine.shutdown()
    return sum(counts), seconds


async def direct_forced(cfg, tasks, in_flight: int) -> tuple[int, float]:
    """The direct loop making the Agents SDK path's turns: turns 1 and 2 held to the forced call's JSON (as
    vLLM holds `tool_choice: required`), answered by a `tool` message with the observation; turn 3 free. Each
    turn renders the whole history, as the engine's OpenAI API does."""
    from operators.engine.client import sampling_params
    from operators.engine.seeds import derive_seed
    from operators.rollout.plugins import load_plugins
    from operators.workflows.base import workflow_class

    load_plugins(AGENT_PLUGINS)
    engine = in_process_engine(cfg)
    forced = workflow_class(AGENT_WORKFLOW).forced_call(engine.tokenizer)
    gate = asyncio.Semaphore(in_flight)

    async def trajectory(task, run_id: int) -> int:
        messages, sampled = [{"role": "user", "content": task.prompt}], 0
        async with gate:
            for turn in range(TURNS):
                seed = derive_seed(task.rollout_args.get("seed"), task.task_uid, run_id, turn)
                sampling = sampling_params(task.rollout_args, 1, seed)
                if turn < TURNS - 1:
                    sampling["structured_outputs"] = forced
                sample = (await engine.chat(messages, sampling))["samples"][0]
                sampled += len(sample["response_ids"])
                if turn == TURNS - 1:
                    break
                try:
                    call = json.loads(CALL.fullmatch(sample["text"]).group(1))
                except (AttributeError, ValueError):  # cut short, unparsed: the run ends, as the SDK's does
                    break
                function = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
                tool_call = {"id": f"call_{turn}", "type": "function", "function": function}
                messages += [
                    {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                    {"role": "tool", "tool_call_id": tool_call["id"], "content": OBSERVATION},
                ]
        return sampled

    try:
        await asyncio.gather(*(trajectory(t, 0) for t in tasks[:4]))  # warm-up
        started = time.perf_counter()
        counts = await asyncio.gather(*(trajectory(t, r) for t in tasks for r in range(t.repeat_times)))
        seconds = time.perf_counter() - started
    finally:
        await engine.shutdown()
    return sum(counts), seconds


def pipeline(cfgs: dict, tmp: Path) -> dict[str, dict[str, float]]:
    """Per workflow, on one warm fleet: sampled tokens and seconds end to end (the pipeline's own start-up
    included) and warm (steps 2..N; steps overlap, so this window overstates the rate), and the splits."""
    import ray
    from mlflow import MlflowClient

    from operators.sinks.parquet import ParquetSink
    from pipelines.explore import explore

    engines = start_fleet(next(iter(cfgs.values())), "bench-multi-turn")
    results = {}
    try:
        ray.get([e.chat.remote([{"role": "user", "content": "1 + 1?"}], {"n": 2}) for e in engines.handles])
        for name, cfg in cfgs.items():
            started = time.perf_counter()
            summary = explore(cfg, tmp / name, progress=False, engines=engines)
            seconds = time.perf_counter() - started
            sink = ParquetSink(summary.run_dir / "experiences")
            steps = {s: sink.read_step(s) for s in sink.committed_steps()}
            sampled = {s: sum(sum(m) for m in t.column("action_mask").to_pylist()) for s, t in steps.items()}
            history = MlflowClient(summary.tracking_uri).get_metric_history(
                summary.mlflow_run_id, "time/step"
            )
            splits = MlflowClient(summary.tracking_uri).get_metric_history(
                summary.mlflow_run_id, "rollout/trajectory_splits"
            )
            results[name] = {
                "tokens": sum(sampled.values()),
                "seconds": round(seconds, 2),
                "warm_tokens": sum(n for s, n in sampled.items() if s > 1),
                "warm_seconds": round(sum(m.value for m in history if m.step > 1), 2),
                "splits": int(sum(m.value for m in splits)),
            }
    finally:
        engines.stop()
    return results


def agents_main(args: argparse.Namespace) -> None:
    """`--agents`: the Agents SDK path against the direct loop forcing the same turns, in one run."""
    cfg = bench_config(
        args,
        f"buffer.explorer_input.taskset.default_workflow_type={AGENT_WORKFLOW}",
        "explorer.rollout_model.enable_openai_api=true",
        "explorer.rollout_model.tool_call_parser=hermes",
        "explorer.rollout_model.json_whitespace=false",
        "monitor.sample_rollouts=0",
        plugin_dir=AGENT_PLUGINS,
    )
    tasks = first_tasks(cfg, args.tasks)
    in_flight = args.in_flight or args.batch_size * args.repeat
    direct_tokens, direct_s = asyncio.run(direct_forced(cfg, tasks, in_flight))
    with tempfile.TemporaryDirectory() as tmp:
        agents = pipeline({"agents": cfg}, Path(tmp))["agents"]
    ratio = agents["tokens"] / agents["seconds"] / (direct_tokens / direct_s)
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "model": str(cfg.model.model_path),
        "tasks": len(tasks),
        "repeat": args.repeat,
        "turns": TURNS,
        "direct_in_flight": in_flight,
        "max_tokens": args.max_tokens,
        "direct_forced": {"tokens": direct_tokens, "seconds": round(direct_s, 2)},
        "agents": agents,
        "tokens_per_s_end_to_end": {
            "direct_forced": round(direct_tokens / direct_s, 1),
            "agents": round(agents["tokens"] / agents["seconds"], 1),
        },
    }
    print(json.dumps(report, indent=2))
    print(f"agents: ratio={ratio:.2f} (target >= 0.60)")


def main() -> None:
    args = parse_args()
    if args.agents:
        agents_main(args)
        return
    cfgs = {
        "pipeline": workflow_config(args, "bench_fixed_env"),
        "sessions": workflow_config(args, "bench_fixed_agent"),
    }
    tasks = first_tasks(cfgs["pipeline"], args.tasks)
    in_flight = args.in_flight or args.batch_size * args.repeat
    direct_tokens, direct_s = asyncio.run(direct(cfgs["pipeline"], tasks, in_flight))
    with tempfile.TemporaryDirectory() as tmp:
        piped = pipeline(cfgs, Path(tmp))
    rate = {"direct": direct_tokens / direct_s}
    rate.update({name: r["tokens"] / r["seconds"] for name, r in piped.items()})
    warm = {name: r["warm_tokens"] / r["warm_seconds"] for name, r in piped.items()}
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "model": str(cfgs["pipeline"].model.model_path),
        "tasks": len(tasks),
        "repeat": args.repeat,
        "turns": TURNS,
        "direct_in_flight": in_flight,
        "max_tokens": args.max_tokens,
        "direct": {"tokens": direct_tokens, "seconds": round(direct_s, 2)},
        **piped,
        "tokens_per_s_end_to_end": {name: round(value, 1) for name, value in rate.items()},
        "tokens_per_s_warm": {name: round(value, 1) for name, value in warm.items()},
        "ratio_warm": {name: round(value / rate["direct"], 3) for name, value in warm.items()},
        "sessions_over_direct_end_to_end": round(rate["sessions"] / rate["direct"], 3),
    }
    print(json.dumps(report, indent=2))
    print(f"multi_turn: ratio={rate['pipeline'] / rate['direct']:.2f} (target >= 0.85)")
    print(f"sessions: ratio={rate['sessions'] / rate['direct']:.2f} (target >= 0.75)")


if __name__ == "__main__":
    main()
