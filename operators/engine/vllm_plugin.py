"""rftflow's vLLM plugin (entry point `vllm.general_plugins` in setup.py), which vLLM loads in each of its
processes: the front end, the engine core and its workers.

With `RFTFLOW_VLLM_BUSY_WAIT=0` (set by `engine_env` from `explorer.rollout_model.busy_wait`) vLLM's engine
core waits for its worker's results with short sleeps rather than `sched_yield` spins. The core reads the
worker's shared-memory queue in a loop that yields the CPU between checks for as long as the worker computes a
step: on CPU that spin took 0.9 of a core on a 2-core machine, away from the worker that runs the model and
from everything else. Sleeping 0.2 ms between checks keeps the wait's latency under a step's by far, and the
core then used 0.1 of a core while the worker got 94-99% of one (see docs/PERFORMANCE.md). Blocking on the
queue's notification socket instead (vLLM's idle path) was tried: it is slower, by 2.5x with the tiny model.
"""

from __future__ import annotations

import functools
import logging
import os
import time

import setproctitle  # vLLM's own dependency, with which it titles its processes

BUSY_WAIT_ENV = "RFTFLOW_VLLM_BUSY_WAIT"
PAUSE_S = 0.0002  # between two checks of the worker's queue

log = logging.getLogger(__name__)


def in_engine_core() -> bool:
    """Whether this is vLLM's engine core process, which vLLM titles before it loads plugins there."""
    return "EngineCore" in setproctitle.getproctitle()


def register() -> None:
    """In the engine core, when `BUSY_WAIT_ENV` is "0": sleep `PAUSE_S` between checks of its queue."""
    if os.environ.get(BUSY_WAIT_ENV) != "0" or not in_engine_core():
        return
    from vllm.distributed.device_communicators import shm_broadcast  # heavy, deferred: vLLM processes only

    if not callable(getattr(shm_broadcast, "sched_yield", None)):
        log.warning("busy_wait=false has no effect with this vLLM version (its queue has no sched_yield)")
        return
    shm_broadcast.sched_yield = functools.partial(time.sleep, PAUSE_S)
