"""The tool models' figures, measured on vLLM as rollouts see it: the numbers in their BUILD_INFO.json.

At temperature 1, on the bundled eval splits (never trained on):
1. `tool_call_rate`: the share of `tool_math` runs on `tool_arith` that call the calculator;
2. `tool_math_reward`: the mean `tool_math` reward there;
3. `arith_reward`: the mean `math` reward on the arithmetic eval split (the model's first skill, kept).
Every task runs through the real workflows (`operators.rollout.runner.run_task`) on an engine client, with
seeded sampling, so on one machine the same model gives the same figures. The engine test of the bands
(tests/engine/test_tool_math.py) calls `measure` on its own engine; `calibrate` starts one for the builder.

The function-calling model (`tiny-fc-llama`) is measured the same way by `measure_fc`, through the engine's
OpenAI API with vLLM's `hermes` tool parser (`tool_math_fc`, sending `tools` and reading `tool_calls`): greedy
(one run per eval prompt) and at temperature 1, each with its call rate (runs that made a call, read or
not), parse rate (calls the parser read, of all made), mean reward, and drift splits (experiences begun
because a prompt did not extend the one before: 0 when the template renders the history to the sampled
bytes). `calibrate_fc` starts an engine for it (tests/engine/test_tool_math_fc.py has its own).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from statistics import fmean
from typing import Any

from operators.engine.actor import VLLMEngine
from operators.engine.client import EngineClient
from operators.rollout.runner import run_task
from pipelines.reference import arith_tasks, tool_arith_tasks
from schemas.config import RolloutArgs
from schemas.engine_config import RolloutModelConfig
from schemas.task import Task

SAMPLES = 4  # runs per eval prompt: 800 per figure, a standard error of about 0.02 on a rate near 0.4
MAX_TOKENS = 24  # a reply's limit: a call or an answer takes at most 13 tokens of the tool model
RUN_TIMEOUT_S = 300.0


def eval_tasks(
    workflow: str, taskset: str, rows: list[dict], samples: int, seed: int, temperature: float = 1.0
) -> list[Task]:
    rollout_args = RolloutArgs(max_tokens=MAX_TOKENS, seed=seed, temperature=temperature).model_dump()
    return [
        Task(
            f"{taskset}/e0/{i}",
            taskset,
            epoch=0,
            index=i,
            step=1,
            prompt=row["prompt"],
            truth=row["answer"],
            workflow=workflow,
            reward_fn="",
            repeat_times=samples,
            rollout_args=rollout_args,
            is_eval=True,
        )
        for i, row in enumerate(rows)
    ]


async def run_all(client: EngineClient, tasks: list[Task]) -> list[dict[str, Any]]:
    """Every experience of every task, all in flight together; a failed task fails the measurement."""
    rows = await asyncio.gather(
        *(run_task(t, client, max_timeout=RUN_TIMEOUT_S, max_retry_times=0) for t in tasks)
    )
    failed = [row["message"] for row in rows if not row["ok"]]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(tasks)} tasks failed, first: {failed[0]}")
    return [e for row in rows for e in row["experiences"]]


async def measure(client: EngineClient, samples: int = SAMPLES, seed: int = 0) -> dict[str, Any]:
    """The three figures on the engine behind `client` (its model as loaded), `samples` runs per prompt."""
    tool_rows = tool_arith_tasks.bundled_splits()["eval"]
    arith_rows = arith_tasks.bundled_splits()["eval"]
    tool = await run_all(client, eval_tasks("tool_math", "tool_arith_eval", tool_rows, samples, seed))
    arith = await run_all(client, eval_tasks("math", "arith_eval", arith_rows, samples, seed))
    return {
        "temperature": 1.0,
        "max_tokens_per_reply": MAX_TOKENS,
        "samples_per_prompt": samples,
        "tool_call_rate": round(fmean(dict(e["reward_parts"])["called_tool"] for e in tool), 4),
        "tool_math_reward": round(fmean(e["reward"] for e in tool), 4),
        "arith_reward": round(fmean(e["reward"] for e in arith), 4),
        "runs": {"tool_math": len(tool), "arith": len(arith)},
    }


def fc_figures(experiences: list[dict[str, Any]]) -> dict[str, Any]:
    """Call rate, parse rate, mean reward and drift splits of `tool_math_fc` experiences."""
    parts = [dict(e["reward_parts"]) for e in experiences if e["segment"] == 0]  # one per run
    made = sum(p["tool_calls"] + p["malformed_calls"] for p in parts)
    return {
        "runs": len(parts),
        "call_rate": round(fmean(p["called_tool"] for p in parts), 4),
        "parse_rate": round(sum(p["tool_calls"] for p in parts) / made, 4) if made else None,
        "reward": round(fmean(e["reward"] for e in experiences if e["segment"] == 0), 4),
        "drift_splits": int(sum(json.loads(e["metrics"])["trajectory_split"] for e in experiences)),
    }


async def measure_fc(client: EngineClient, samples: int = SAMPLES, seed: int = 0) -> dict[str, Any]:
    """The function-calling figures (see the module), greedy and at temperature 1 (`samples` runs a prompt),
    on the engine behind `client`, whose OpenAI API runs the `hermes` tool parser."""
    rows = tool_arith_tasks.bundled_splits()["eval"]
    greedy = eval_tasks("tool_math_fc", "tool_arith_eval", rows, 1, seed, temperature=0.0)
    sampled = eval_tasks("tool_math_fc", "tool_arith_eval", rows, samples, seed)
    return {
        "max_tokens_per_reply": MAX_TOKENS,
        "greedy": fc_figures(await run_all(client, greedy)),
        "temperature_1": {"samples_per_prompt": samples, **fc_figures(await run_all(client, sampled))},
    }


async def on_engine(
    model_dir: Path,
    rollout: RolloutModelConfig,
    measured: Callable[[EngineClient], Awaitable[dict[str, Any]]],
) -> dict[str, Any]:
    """`measured(client)` on an in-process vLLM CPU engine started on `model_dir`, stopped afterwards; with
    the vLLM version and the dtype the figures are for."""
    import vllm  # heavy, deferred: only a calibration starts an engine here

    engine = VLLMEngine(str(model_dir), rollout.model_dump(mode="json"))
    try:
        await engine.ready()
        # dtype `auto` is bfloat16 on CPUs that have it: the figures are for the dtype recorded
        dtype = str(engine.llm.model_config.dtype).removeprefix("torch.")
        return {"vllm": vllm.__version__, "dtype": dtype, **await measured(EngineClient(engine))}
    finally:
        await engine.shutdown()


def calibrate(model_dir: Path) -> dict[str, Any]:
    """`measure` on an in-process vLLM CPU engine started on `model_dir`, stopped afterwards."""
    # AsyncLLM binds its output handler to the loop it first runs on: start, use and stop it on one loop
    return asyncio.run(on_engine(model_dir, RolloutModelConfig(device="cpu"), measure))


def calibrate_fc(model_dir: Path) -> dict[str, Any]:
    """`measure_fc` on an in-process engine on `model_dir` serving its OpenAI API with the hermes parser."""
    rollout = RolloutModelConfig(device="cpu", enable_openai_api=True, tool_call_parser="hermes")
    return asyncio.run(on_engine(model_dir, rollout, measure_fc))
