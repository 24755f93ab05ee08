"""An engine that dies during `Explorer.benchmark()` comes back on the checkpoint under test, not the run's.

The benchmark loads each checkpoint through the `EngineFleet`, which moves its restore point, so a replacement
made mid-benchmark is put on the weights being measured. Here a test double of the eval workflow SIGKILLs its
engine's process while its own request for checkpoint step 3 is in flight (an engine dying at a chosen moment
is a fault real parts cannot show on demand), waits for that request to be answered by the replacement, and
records what the replacement holds with `get_weight`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from operators.engine.checkpoints import write_checkpoint
from pipelines.explorer import Explorer
from schemas.config import DEFAULT_EVAL, DEFAULT_MODEL, load_config

NORM = "model.norm.weight"
STEP = 3
KILLER_PLUGINS = Path(__file__).resolve().parents[1] / "killer_plugins"  # the workflow doubles that kill


@pytest.mark.timeout(900)  # starts engines of its own and replaces one: minutes on 2 cores
def test_an_engine_killed_mid_benchmark_is_replaced_on_the_checkpoint_under_test(tmp_path):
    base = load_file(str(DEFAULT_MODEL / "model.safetensors"))
    state = {**base, NORM: base[NORM] * 1.5}  # weights the base cannot be mistaken for
    checkpoints = tmp_path / "checkpoints"
    write_checkpoint(checkpoints, STEP, state, DEFAULT_MODEL)
    small = tmp_path / "small.jsonl"
    small.write_text("".join(DEFAULT_EVAL.read_text().splitlines(keepends=True)[:4]))
    marker, held_file = tmp_path / "killed", tmp_path / "held.pt"
    cfg = load_config(
        None,
        [
            "buffer.batch_size=4",
            "buffer.explorer_input.taskset.repeat_times=2",
            f"synchronizer.checkpoint_dir={checkpoints}",
            "explorer.eval_on_startup=false",
            "explorer.health_check_interval=1",
            "ray.num_cpus=4",
        ],
    )
    eval_set = cfg.buffer.explorer_input.taskset.model_copy(
        update={"name": "small", "path": small, "default_workflow_type": "double_eval_engine_killer"}
    )
    eval_set.workflow_args = {
        "marker": str(marker), "kill_step": STEP, "held": str(held_file), "weight": NORM,
    }  # fmt: skip
    cfg.buffer.explorer_input.eval_tasksets = [eval_set]
    cfg.plugin_dirs = [KILLER_PLUGINS]
    explorer = Explorer(cfg, tmp_path / "run", progress=False)

    async def run() -> tuple[bool, torch.Tensor]:
        try:
            await explorer.prepare()
            ok = await explorer.benchmark()
            return ok, await explorer.get_weight(NORM)  # after the benchmark: the run's version again
        finally:
            await explorer.shutdown()

    ok, after = asyncio.run(run())
    assert ok and marker.exists()  # the benchmark succeeded, and the engine really was killed in it
    assert explorer.fleet.restarts == 1
    held = torch.load(held_file)
    assert torch.equal(held, state[NORM].to(held.dtype))  # the replacement held the checkpoint under test
    assert not torch.equal(held, base[NORM].to(held.dtype))
    [results] = list(Path(explorer.run_dir, "bench").glob(f"step_{STEP}-*/small.parquet"))
    table = pq.read_table(results)
    assert len(table) == 4 * 2 and pc.all(pc.equal(table.column("model_version"), STEP)).as_py()
    assert torch.equal(after, base[NORM].to(after.dtype))  # put back on the run's weights (version 0)
