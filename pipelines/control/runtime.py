"""Ray start-up, with the settings that keep a 2-core laptop from starving."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from operators.actors.names import NAMESPACE
from schemas.config import RayConfig


def init_ray(cfg: RayConfig, address: str | None = None, verbose: bool = False) -> None:
    """Join `address` (a cluster) or start a local Ray with explicit CPUs and object store."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray  # heavy, deferred: the driver's modules import without Ray

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
