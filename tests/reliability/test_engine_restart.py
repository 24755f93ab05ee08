"""Engine self-healing on the real stack: an engine actor killed mid-step is replaced on the current version.

The run syncs to checkpoint version 5 after step 1, then a test double of a workflow SIGKILLs the engine's
process while its own request is in flight in step 3 (an engine dying at a chosen moment is a fault real parts
cannot show on demand). The engine fleet must notice, start a replacement under the same name, load version 5
into it (not the base weights), and the lost request must be sent again, so the run completes with every
experience exactly once and no failed task.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import ray
import torch
from mlflow import MlflowClient
from safetensors.torch import load_file

from operators.engine.checkpoints import write_checkpoint
from operators.engine.proc_stats import open_files_under, process_tree
from pipelines.explorer import Explorer
from schemas.config import DEFAULT_MODEL, load_config

STEPS, BATCH, REPEAT, VERSION, KILL_STEP = 4, 4, 2, 5, 3
NORM = "model.norm.weight"
KILLER_PLUGINS = Path(__file__).resolve().parents[1] / "killer_plugins"  # the workflow doubles that kill


def killer_run(tmp_path: Path, kill_step: int, *overrides: str) -> tuple[Explorer, dict[str, torch.Tensor]]:
    """An explorer (engines of its own) whose killer double strikes in `kill_step`, after a sync to version 5
    written on disk for it; returns it and that version's weights."""
    checkpoints = tmp_path / "checkpoints"
    base = load_file(str(DEFAULT_MODEL / "model.safetensors"))
    state = {**base, NORM: base[NORM] * 1.5}  # a version the base weights cannot be mistaken for
    write_checkpoint(checkpoints, VERSION, state, DEFAULT_MODEL)
    (checkpoints / "trainer_status.json").write_text(f'{{"state": "stopped", "version": {VERSION}}}')
    cfg = load_config(
        None,
        [
            f"buffer.total_steps={STEPS}",
            f"buffer.batch_size={BATCH}",
            f"buffer.explorer_input.taskset.repeat_times={REPEAT}",
            "buffer.explorer_input.taskset.rollout_args.max_tokens=32",
            "buffer.explorer_input.taskset.default_workflow_type=double_engine_killer",
            "synchronizer.sync_method=checkpoint",
            f"synchronizer.checkpoint_dir={checkpoints}",
            "explorer.health_check_interval=1",
            "ray.num_cpus=4",
            *overrides,
        ],
    )
    cfg.buffer.explorer_input.taskset.workflow_args = {
        "marker": str(tmp_path / "killed"), "kill_step": kill_step, "version": VERSION,
        "mid_continuation": "synchronizer.partial_rollout=true" in overrides,
    }  # fmt: skip
    cfg.plugin_dirs = [KILLER_PLUGINS]
    return Explorer(cfg, tmp_path / "run", progress=False), state


@pytest.mark.timeout(900)  # starts engines of its own and replaces one: minutes on 2 cores
def test_a_killed_engine_is_replaced_on_the_current_version_and_the_run_completes(tmp_path):
    explorer, state = killer_run(tmp_path, KILL_STEP)
    base = load_file(str(DEFAULT_MODEL / "model.safetensors"))
    marker = tmp_path / "killed"

    async def run() -> tuple[torch.Tensor, list[int]]:
        try:
            await explorer.explore()
            pids = ray.get([h.ready.remote() for h in explorer.fleet.handles])
            engine_processes = [p for ready in pids for p in process_tree(ready["pid"])]
            return await explorer.get_weight(NORM), engine_processes  # read back from the replacement
        finally:
            await explorer.shutdown()

    held, engine_processes = asyncio.run(run())
    assert len(engine_processes) >= 2  # the actor and its vLLM core
    assert_nothing_left(explorer, engine_processes)
    assert marker.exists()  # the engine really was killed, in step 3
    assert explorer.fleet.restarts == 1
    assert torch.equal(held, state[NORM].to(held.dtype))  # in the engine's dtype
    assert not torch.equal(held, base[NORM].to(held.dtype))
    table = pq.read_table(explorer.run_dir / "experiences")
    keys = list(zip(table.column("task_uid").to_pylist(), table.column("run_id").to_pylist(), strict=True))
    assert len(keys) == len(set(keys)) == STEPS * BATCH * REPEAT  # nothing lost, nothing twice
    assert explorer.totals["failed"] == 0  # the lost request was sent again, not failed
    later = table.filter(pc.greater_equal(table.column("step"), 2))
    assert set(later.column("model_version").to_pylist()) == {VERSION}  # the replacement ran version 5

    client = MlflowClient(explorer.tracking_uri)
    history = client.get_metric_history(explorer.monitor.run_id, "engine/restarts")
    restarts = {m.step: m.value for m in history}
    assert sorted(restarts) == list(range(1, STEPS + 1))
    assert restarts[KILL_STEP - 1] == 0 and restarts[STEPS] == 1


@pytest.mark.timeout(900)  # starts engines of its own and replaces one: minutes on 2 cores
def test_an_engine_killed_mid_continuation_is_replaced_and_the_sample_resent_once(tmp_path):
    """Partial rollout: step 2 starts before the sync after step 1, which cuts its generations; the engine
    is killed while the killer's goes on under version 5. The partial output lived in the engine and is lost
    with it, so the request is sent again whole to the replacement (version 5); nothing is written twice."""
    explorer, _ = killer_run(tmp_path, 2, "synchronizer.partial_rollout=true")
    marker = tmp_path / "killed"

    async def run() -> list[int]:
        try:
            await explorer.explore()
            pids = ray.get([h.ready.remote() for h in explorer.fleet.handles])
            return [p for ready in pids for p in process_tree(ready["pid"])]
        finally:
            await explorer.shutdown()

    engine_processes = asyncio.run(run())
    assert_nothing_left(explorer, engine_processes)
    verdict, killer = marker.read_text().split()
    assert verdict == "cut"  # killed while its request went on across the sync
    assert explorer.fleet.restarts == 1 and explorer.totals["failed"] == 0
    rows = pq.read_table(explorer.run_dir / "experiences").to_pylist()
    keys = [(r["task_uid"], r["run_id"]) for r in rows]
    assert len(keys) == len(set(keys)) == STEPS * BATCH * REPEAT  # nothing lost, nothing twice
    resent = [r for r in rows if r["task_uid"] == killer]
    assert len(resent) == REPEAT
    for row in resent:  # sampled again from the start on the replacement, which holds version 5
        assert row["token_versions"] == [VERSION] * 200 and row["model_version"] == VERSION
    assert {r["model_version"] for r in rows if r["step"] == 1} == {0}


def run_actors(explorer: Explorer) -> list[str]:
    """The run's named actors and its stream's forwarders (those that enlisted at its gate) still alive, by
    GCS's own list. Forwarders of other tests' runs in this session's Ray are not the run's to end."""
    alive = {aid: a for aid, a in ray._private.state.actors().items() if a["State"] == "ALIVE"}
    named = [a["Name"] for a in alive.values() if a["Name"].startswith(f"{explorer.name}/")]
    return named + [alive[aid]["ActorClassName"] for aid in explorer.forwarders if aid in alive]


def assert_nothing_left(explorer: Explorer, engine_processes: list[int]) -> None:
    """After shutdown: none of the run's actors alive, no engine process, no run-directory file held open."""
    deadline = time.monotonic() + 60  # killed actors' processes take a moment to exit
    while any(Path(f"/proc/{pid}").exists() for pid in engine_processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [pid for pid in engine_processes if Path(f"/proc/{pid}").exists()] == []
    assert explorer.forwarders  # the stream's forwarders enlisted at its gate, and were ended
    # a killed actor is marked dead in GCS's own list a moment after the kill
    while (left := run_actors(explorer)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []
    assert open_files_under(explorer.run_dir) == []
