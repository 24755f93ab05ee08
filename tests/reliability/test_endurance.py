"""Endurance: 200 small steps on the real stack, with the memory of the driver and the engine read each step.

Memory that grows with the number of steps (a list of every step's records, metric histories kept on the
driver, requests the engine never frees) shows here as resident memory that keeps rising after warm-up.
"""

from __future__ import annotations

import asyncio
import os

import ray
from integration_settings import BASE

from operators.engine.proc_stats import read_memory
from pipelines.explorer import Explorer
from schemas.config import load_config

STEPS, WARM_UP = 200, 20
MAX_GROWTH = 1.10  # the bound: peak memory after step 20 within 10% of memory at step 20


def engine_rss(engines) -> int:
    """The engine actor's and its vLLM core's resident memory together."""
    trees = ray.get([h.memory.remote() for h in engines.handles])
    return sum(m["rss"] for tree in trees for m in tree.values())


def test_two_hundred_steps_keep_driver_and_engine_memory_flat(engines, tmp_path):
    cfg = load_config(
        None,
        [
            *BASE,
            f"buffer.total_steps={STEPS}",
            "buffer.batch_size=2",
            "buffer.explorer_input.taskset.repeat_times=1",
            "buffer.explorer_input.taskset.rollout_args.max_tokens=8",
            "monitor.sample_rollouts=2",
        ],
    )
    explorer = Explorer(cfg, tmp_path / "run", progress=False, engines=engines)
    driver, engine = [], []

    async def run() -> None:
        try:
            await explorer.prepare()
            while await explorer.explore_step():
                driver.append(read_memory(os.getpid())["rss"])
                engine.append(engine_rss(engines))
        finally:
            await explorer.shutdown()

    asyncio.run(run())
    assert len(driver) == STEPS and explorer.totals["experiences"] == STEPS * 2
    for name, series in (("driver", driver), ("engine", engine)):
        at_warm_up, peak = series[WARM_UP - 1], max(series[WARM_UP - 1 :])
        mib = [round(v / 2**20) for v in series[WARM_UP - 1 :: 20]]
        assert peak < MAX_GROWTH * at_warm_up, f"{name} RSS grew from step {WARM_UP}: {mib} MiB"
