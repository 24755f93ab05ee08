"""Making engine actors: the runtime environment, the actor's options, its placement group and the check that
the cluster can hold the fleet at all.

`EngineFleet` (`fleet.py`) owns the engines once they exist: their weights, health and replacement. This
module only makes them, each in its own placement group (`placement.py` says where), so the fleet asks it
for an engine by index and gives the group back when that engine is stopped or replaced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from operators.engine.actor import VLLMEngine
from pipelines.control.placement import (
    EngineShape,
    choose_node,
    engine_shape,
    group_node,
    live_nodes,
    refusal,
    release,
    reserve,
)
from schemas.config import Config
from schemas.errors import InputError

log = logging.getLogger(__name__)
NAME_FREE_S = 10.0  # how long the old actor's name may take to be released after it is killed


def resolve_device(cfg: Config) -> str:
    """`auto` means GPU when the Ray cluster has one (the driver itself may not)."""
    import ray  # heavy, deferred: the driver's modules import without Ray

    device = cfg.explorer.rollout_model.device
    if device == "auto":
        device = "gpu" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
    return device


def engine_runtime_env() -> dict[str, Any]:
    """Quiet engines unless asked: vLLM logs at ERROR, Python warnings off (VLLM_LOGGING_LEVEL overrides)."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")
    quiet = level in ("ERROR", "CRITICAL")
    return {"env_vars": {"VLLM_LOGGING_LEVEL": level, **({"PYTHONWARNINGS": "ignore"} if quiet else {})}}


def launch_engine(cfg: Config, name: str, closed: bool = False, index: int = 0, group: Any = None) -> Any:
    """One engine actor called `name` on the base model; `closed` holds its requests until its first load
    (a replacement must be put on the fleet's restore point before it serves anything). Engine `index`
    serves its OpenAI API (when enabled) on `port + index`, or on a free port when `port` is 0. `group`:
    the engine's placement group (`pipelines.control.placement`); the actor takes its share of bundle 0."""
    import ray  # heavy, deferred: the driver's modules import without Ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # heavy, deferred: as ray

    rollout = cfg.explorer.rollout_model
    port = rollout.port + index if rollout.port else 0
    rollout = rollout.model_copy(update={"device": resolve_device(cfg), "port": port})
    shape = engine_shape(rollout.tensor_parallel_size, rollout.device == "gpu", rollout.engine_cpus)
    options: dict[str, Any] = {"num_cpus": shape.actor_cpus, "num_gpus": shape.actor_gpus}
    if group is not None:
        # capture: anything the engine starts (vLLM's Ray workers, one per rank) stays in its group
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, 0, True)
    actor = ray.remote(VLLMEngine).options(name=name, runtime_env=engine_runtime_env(), **options)
    lora = None if cfg.model.lora is None else cfg.model.lora.model_dump(mode="json")
    return actor.remote(str(cfg.model.model_path), rollout.model_dump(mode="json"), 0, closed, lora)


def fleet_shape(cfg: Config) -> EngineShape:
    rollout = cfg.explorer.rollout_model
    return engine_shape(rollout.tensor_parallel_size, resolve_device(cfg) == "gpu", rollout.engine_cpus)


def check_resources(cfg: Config) -> None:
    """Refuse at once an engine request the cluster can never grant (Ray would leave it pending for ever)."""
    reason = refusal(fleet_shape(cfg), cfg.explorer.rollout_model.engine_num, live_nodes())
    if reason is not None:
        raise InputError(
            f"{reason}: lower explorer.rollout_model.engine_num or engine_cpus, or give Ray more "
            "(ray.num_cpus)",
            field="explorer.rollout_model.engine_cpus",
        )


def launch_when_free(launch: Callable[[str, bool], Any], name: str, closed: bool) -> Any:
    """`launch(name, closed)` for a new actor under `name`, once the killed one has released the name."""
    deadline = time.monotonic() + NAME_FREE_S
    while True:
        try:
            return launch(name, closed)
        except InputError:  # no room for its placement group: waiting on here would not help
            raise
        except ValueError:  # "name already taken": the old actor is not gone yet
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


class EngineLauncher:
    """The fleet's default way to make engine `names[i]`: its placement group (one per engine life), then its
    actor. Keeps each engine's group and the node it was placed on, so the next engine can prefer a node by
    `explorer.rollout_model.placement`, and a replaced engine chooses afresh once its group is released."""

    def __init__(self, cfg: Config, names: list[str]):
        self.cfg = cfg
        self.names = names
        self.groups: list[Any] = [None] * len(names)  # each engine's placement group, once reserved
        self.nodes: list[str | None] = [None] * len(names)  # the node each group was placed on

    def launch(self, index: int, closed: bool, timeout: float) -> Any:
        """Engine `index`'s actor, in its group; a group not placed within `timeout` seconds is refused."""
        name = self.names[index]
        if self.groups[index] is None:
            shape, placement = fleet_shape(self.cfg), self.cfg.explorer.rollout_model.placement
            others = [node for i, node in enumerate(self.nodes) if i != index and node is not None]
            target = choose_node(live_nodes(), others, shape.total, placement)
            group = reserve(shape, target, name, timeout)
            self.groups[index], self.nodes[index] = group, group_node(group)
            log.debug("%s placed on node %s (%s: preferred %s)", name, self.nodes[index], placement, target)
            log.info("starting engine %d of %d on node %s", index + 1, len(self.names), self.nodes[index])
        return launch_engine(self.cfg, name, closed=closed, index=index, group=self.groups[index])

    def release(self, index: int) -> None:
        """Give engine `index`'s group back (the engine is stopped, or about to be replaced)."""
        if self.groups[index] is not None:
            with contextlib.suppress(Exception):  # already gone with its node, or with Ray
                release(self.groups[index])
        self.groups[index], self.nodes[index] = None, None
