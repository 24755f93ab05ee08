"""Two explores on a Ray cluster of three nodes on this machine, the second losing a node mid-run.

Run by `test_two_nodes.py` in a process of its own: it needs its own Ray cluster (`ray.cluster_utils.Cluster`:
a head with one CPU and two worker nodes, each with its own CPUs and a custom resource naming it), which
cannot be the session Ray of the other tests. It writes what it saw as JSON for the test to check:

    python tests/multinode/two_nodes_run.py OUT_DIR

1. Two engines (2 CPUs each, so the head holds none) start on the cluster with `placement: spread`. The
   first explore runs undisturbed, syncing to checkpoint version 5 after step 1.
2. The second explore, on the same engines, removes the node of engine 1 once step 2 is committed. The fleet
   replaces the lost engine on the surviving worker node at version 5, and the run completes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

# A thread still calling Ray after `ray.shutdown()` must not connect again (to this cluster, which then
# refuses to shut its head down under a connected driver).
os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"

import ray  # noqa: E402 - after the setting above
import torch  # noqa: E402
from ray.cluster_utils import Cluster
from safetensors.torch import load_file

from operators.engine.checkpoints import write_checkpoint
from pipelines.control.fleet import EngineFleet
from pipelines.control.runtime import init_ray
from pipelines.explorer import Explorer
from schemas.config import DEFAULT_MODEL, Config, load_config

STEPS, BATCH, REPEAT, VERSION, REMOVE_AFTER_STEP = 4, 4, 2, 5, 2
WORKER_CPUS, ENGINE_CPUS = 6, 2  # room on one worker for both engines and the stream's forwarders
NODE_MIB = 150  # object store per node
NORM = "model.norm.weight"

log = logging.getLogger("two_nodes")


def start_cluster() -> tuple[Cluster, dict[str, object]]:
    """A head too small for an engine, and two worker nodes, each with a custom resource naming it."""
    store = NODE_MIB * 2**20
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": store},
    )
    workers = {
        label: cluster.add_node(num_cpus=WORKER_CPUS, resources={label: 1}, object_store_memory=store)
        for label in ("node_a", "node_b")
    }
    cluster.wait_for_nodes()
    return cluster, workers


def config(address: str, checkpoints: Path) -> Config:
    return load_config(
        None,
        [
            f"buffer.total_steps={STEPS}",
            f"buffer.batch_size={BATCH}",
            f"buffer.explorer_input.taskset.repeat_times={REPEAT}",
            "buffer.explorer_input.taskset.rollout_args.max_tokens=16",
            "explorer.rollout_model.engine_num=2",
            f"explorer.rollout_model.engine_cpus={ENGINE_CPUS}",
            "explorer.rollout_model.placement=spread",
            "explorer.rollout_model.dtype=float32",  # as integration_settings.BASE: bfloat16 is emulated here
            "explorer.health_check_interval=1",
            "explorer.engine_restart_timeout=240",
            "synchronizer.sync_method=checkpoint",
            f"synchronizer.checkpoint_dir={checkpoints}",
            f"ray.address={address}",
        ],
    )


def write_version(checkpoints: Path) -> torch.Tensor:
    """Version 5: the base weights with one tensor scaled, so it cannot be mistaken for the base; the trainer
    has stopped there. Returns that tensor."""
    base = load_file(str(DEFAULT_MODEL / "model.safetensors"))
    scaled = base[NORM] * 1.5
    write_checkpoint(checkpoints, VERSION, {**base, NORM: scaled}, DEFAULT_MODEL)
    (checkpoints / "trainer_status.json").write_text(f'{{"state": "stopped", "version": {VERSION}}}')
    return scaled


def engines(fleet: EngineFleet, version: torch.Tensor) -> dict[str, list]:
    """Where each engine's placement group was placed, where its actor says it runs, the version it says it
    holds, and whether it holds version 5's weights (read back from the engine)."""
    ready = ray.get([h.ready.remote() for h in fleet.handles], timeout=180)  # room on a loaded machine
    held = ray.get([h.get_weight.remote(NORM) for h in fleet.handles], timeout=180)
    return {
        "placed": list(fleet.launcher.nodes),
        "running": [r["node_id"] for r in ready],
        "versions": [r["model_version"] for r in ready],
        "holds_version_5": [torch.equal(t, version.to(t.dtype)) for t in held],
    }


def actor_node(name: str) -> str | None:
    """The node of the live actor called `name`, by GCS's own table."""
    alive = [a for a in ray._private.state.actors().values() if a["State"] == "ALIVE" and a["Name"] == name]
    return alive[0]["Address"]["NodeID"] if alive else None


def remove_when_committed(
    explorer: Explorer, cluster: Cluster, workers: dict, placed: list[str], seen: dict
) -> threading.Thread:
    """Remove an engine's node from the cluster once the run has committed REMOVE_AFTER_STEP (from a thread:
    the run goes on in the main one). Not the node of the driver or of the run's gate: losing those ends the
    run, as losing the driver would. On one machine all nodes share an address, so the driver may attach to a
    worker node, and the gate's soft affinity to the driver's node is not always honoured."""

    def watch() -> None:
        deadline = time.monotonic() + 300
        while explorer.state.latest_step < REMOVE_AFTER_STEP and time.monotonic() < deadline:
            time.sleep(0.05)
        seen["removed_at_step"] = explorer.state.latest_step
        seen["gate_node"] = actor_node(explorer.gate_name)
        spared = {seen["gate_node"], ray.get_runtime_context().get_node_id()}
        seen["lost"] = next(node for node in reversed(placed) if node not in spared)
        cluster.remove_node(next(n for n in workers.values() if n.node_id == seen["lost"]))
        seen["removed_at_s"] = time.monotonic()

    thread = threading.Thread(target=watch, name="remove-node", daemon=True)
    thread.start()
    return thread


async def explore(explorer: Explorer) -> None:
    try:
        await explorer.explore()
    finally:
        await explorer.shutdown()


def main(out: Path) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    started = time.monotonic()
    version = write_version(out / "checkpoints")
    cluster, workers = start_cluster()
    # at once, so the test can find (and end) this cluster's processes even if this one is killed
    (out / "cluster.json").write_text(json.dumps({"address": cluster.address}))
    report: dict = {
        "nodes": {label: node.node_id for label, node in workers.items()},
        "run": {"steps": STEPS, "batch": BATCH, "repeat": REPEAT, "version": VERSION},
        "remove_after_step": REMOVE_AFTER_STEP,
    }
    fleet = None
    try:
        cfg = config(cluster.address, out / "checkpoints")
        init_ray(cfg.ray)
        fleet = EngineFleet(cfg, "two-nodes").start()
        report["started_s"] = time.monotonic() - started
        report["before"] = engines(fleet, version)

        asyncio.run(explore(Explorer(cfg, out / "undisturbed", progress=False, engines=fleet)))
        report["undisturbed_s"] = time.monotonic() - started

        explorer = Explorer(cfg, out / "disturbed", progress=False, engines=fleet)
        seen: dict = {}
        watcher = remove_when_committed(explorer, cluster, workers, report["before"]["placed"], seen)
        asyncio.run(explore(explorer))
        watcher.join(timeout=10)
        report["removed"] = {"node": seen.get("lost"), "after_step": seen.get("removed_at_step")}
        report["driver_node"], report["gate_node"] = (
            ray.get_runtime_context().get_node_id(),
            seen.get("gate_node"),
        )
        report["restarts"] = fleet.restarts
        report["after"] = engines(fleet, version)
        report["alive_nodes"] = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        report["failed"] = explorer.totals.get("failed")
        report["total_s"] = time.monotonic() - started
    finally:
        stopping = time.monotonic()
        if fleet is not None:
            try:
                fleet.stop()
            except Exception:  # the cluster still goes down below, and the run has failed already
                log.exception("stopping the engines")
        ray.shutdown()
        cluster.shutdown()
        report["shutdown_s"] = time.monotonic() - stopping
        (out / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
