"""Ray start-up, with the settings that keep a 2-core laptop from starving; and the moment it marks, where a
command stops only reading its inputs and its run begins."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from operators.actors.names import NAMESPACE
from schemas.config import RayConfig


class InputsPhase:
    """Whether the current command is still only reading its inputs.

    Every input is checked before Ray starts, so an OSError raised before `init_ray` came from reading an
    input (bad input: exit 2), and one raised after it is the run's own failure. The flag is explicit, not
    `ray.is_initialized()`, because a process that runs commands one after another (a notebook, the tests)
    keeps Ray up between them.
    """

    reading = False


@contextlib.contextmanager
def reading_inputs() -> Iterator[None]:
    """Mark a command's inputs phase; `init_ray` ends it."""
    InputsPhase.reading = True
    try:
        yield
    finally:
        InputsPhase.reading = False


def init_ray(cfg: RayConfig, address: str | None = None, verbose: bool = False) -> None:
    """Join `address` (a cluster) or start a local Ray with explicit CPUs and object store. This ends the
    command's inputs phase (see `InputsPhase`), whether or not Ray was already up."""
    InputsPhase.reading = False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray  # heavy, deferred: the driver's modules import without Ray

    if ray.is_initialized():
        return
    address = address or cfg.address
    common: dict[str, Any] = {"namespace": NAMESPACE, "logging_level": logging.WARNING, "log_to_driver": True}
    if address:
        ray.init(address=address, **common)
    else:
        # "local": a new Ray of its own even when the machine runs a cluster (`ray start`, a test's
        # `Cluster`), which a bare `ray.init()` would join, and then refuse the CPUs and object store given
        ray.init(
            address="local",
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
