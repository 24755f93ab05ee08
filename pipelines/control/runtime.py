"""Ray start-up, with the settings that keep a 2-core laptop from starving; and the moment it marks, where a
command stops only reading its inputs and its run begins."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from operators.actors.names import NAMESPACE
from pipelines.control.console import worker_env
from schemas.config import RayConfig

log = logging.getLogger(__name__)


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
    command's inputs phase (see `InputsPhase`), whether or not Ray was already up. Its workers log as
    `pipelines.control.console` says (quiet unless `verbose`)."""
    InputsPhase.reading = False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray  # heavy, deferred: the driver's modules import without Ray

    if ray.is_initialized():
        return
    address = address or cfg.address
    common: dict[str, Any] = {
        "namespace": NAMESPACE,
        # Ray's own driver-side notices (e.g. that a new local cluster uses token authentication) only
        # with -v; its errors always
        "logging_level": logging.INFO if verbose else logging.ERROR,
        "log_to_driver": True,
        "runtime_env": worker_env(verbose),
    }
    if address:
        log.info("joining the Ray cluster at %s", address)
        ray.init(address=address, **common)
    else:
        num_cpus = cfg.num_cpus or max(4, os.cpu_count() or 1)
        log.info("starting Ray on this machine (%d CPUs)", num_cpus)
        # "local": a new Ray of its own even when the machine runs a cluster (`ray start`, a test's
        # `Cluster`), which a bare `ray.init()` would join, and then refuse the CPUs and object store given
        ray.init(
            address="local",
            num_cpus=num_cpus,
            object_store_memory=cfg.object_store_memory_mib * 2**20,
            include_dashboard=False,
            **common,
        )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # rftflow draws its own bar, per step
    context.verbose_stats_logs = False
