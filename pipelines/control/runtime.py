"""Ray start-up and engine actors, with the settings that keep a 2-core laptop from starving."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from operators.actors.names import NAMESPACE
from schemas.config import Config, RayConfig
from schemas.errors import InputError


def init_ray(cfg: RayConfig, address: str | None = None, verbose: bool = False) -> None:
    """Join `address` (a cluster) or start a local Ray with explicit CPUs and object store."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return
    address = address or cfg.address
    common: dict[str, Any] = {"namespace": NAMESPACE, "logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        ray.init(address=address, **common)
    else:
        ray.init(
            num_cpus=cfg.num_cpus or max(4, os.cpu_count() or 1),
            object_store_memory=cfg.object_store_memory_mib * 2**20,
            include_dashboard=False,
            **common,
        )
    if not verbose:  # Ray Data re-reads this for each dataset; its INFO lines would drown the progress bar
        os.environ.setdefault(
            "RAY_DATA_LOGGING_CONFIG", str(Path(__file__).with_name("ray_data_logging.yaml"))
        )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # rftflow draws its own bar, per step
    context.verbose_stats_logs = False


def check_model_dir(path: Path) -> None:
    if not Path(path).is_dir():
        raise InputError("model directory not found", file=str(path), field="model.model_path")
    if not (Path(path) / "config.json").is_file():
        raise InputError(
            "not a Hugging Face model directory (no config.json)", file=str(path), field="model.model_path"
        )


def resolve_device(cfg: Config) -> str:
    """`auto` means GPU when the Ray cluster has one (the driver itself may not)."""
    import ray

    device = cfg.explorer.rollout_model.device
    if device == "auto":
        device = "gpu" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
    return device


@dataclass
class EngineSet:
    """Engine actors by name (what Ray Data operators get: plain strings) and by handle (for the driver)."""

    names: list[str]
    handles: list[Any]


def engine_runtime_env() -> dict[str, Any]:
    """Quiet engines unless asked: vLLM logs at ERROR, Python warnings off (VLLM_LOGGING_LEVEL overrides)."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "ERROR")
    quiet = level in ("ERROR", "CRITICAL")
    return {"env_vars": {"VLLM_LOGGING_LEVEL": level, **({"PYTHONWARNINGS": "ignore"} if quiet else {})}}


def launch_engines(cfg: Config, run_name: str) -> EngineSet:
    """Create the named, long-lived engine actors; they load the model in the background."""
    check_model_dir(cfg.model.model_path)
    names = [f"{run_name}/engine-{i}" for i in range(cfg.explorer.rollout_model.engine_num)]
    return EngineSet(names, [launch_engine(cfg, name) for name in names])


def launch_engine(cfg: Config, name: str, closed: bool = False) -> Any:
    """One engine actor called `name` on the base model; `closed` holds its requests until its first load
    (a replacement must be put on the run's current version before it serves anything)."""
    import ray

    from operators.engine.actor import VLLMEngine

    rollout = cfg.explorer.rollout_model.model_copy(update={"device": resolve_device(cfg)})
    gpus = rollout.tensor_parallel_size if rollout.device == "gpu" else 0
    options = {"num_cpus": rollout.engine_cpus, "num_gpus": gpus, "runtime_env": engine_runtime_env()}
    actor = ray.remote(VLLMEngine).options(name=name, **options)
    return actor.remote(str(cfg.model.model_path), rollout.model_dump(mode="json"), 0, closed)


def wait_engines(engines: EngineSet) -> None:
    """Block until every engine has loaded its model, so start errors surface here with their reason."""
    import ray

    ray.get([engine.ready.remote() for engine in engines.handles])


def start_engines(cfg: Config, run_name: str) -> EngineSet:
    """Launch and wait; engines that fail to start are not left behind."""
    engines = launch_engines(cfg, run_name)
    try:
        wait_engines(engines)
    except BaseException:
        stop_engines(engines)
        raise
    return engines


def stop_engines(engines: EngineSet | None) -> None:
    """Free the engines' memory now rather than when the driver exits; vLLM's own shutdown ends its core."""
    import ray

    if engines is None:
        return
    with contextlib.suppress(Exception):  # a dead or stuck engine is killed below all the same
        ray.get([engine.shutdown.remote() for engine in engines.handles], timeout=30)
    for engine in engines.handles:
        ray.kill(engine)
