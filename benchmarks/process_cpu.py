"""CPU seconds a benchmark's own processes use, by role: this driver process and every process below it (a
local Ray starts its GCS, raylet and workers as the driver's descendants), so other users of a shared machine
are not counted. CPU time, unlike wall time, barely moves with the machine's load, so per-task CPU costs say
what a quiet or bigger machine would sustain.
"""

from __future__ import annotations

import bisect
import os
import threading
import time

import psutil

# The first prefix that a process's command line starts with (Ray sets `ray::<Actor or task>` as the title).
GATE = "step gate"
FORWARDERS = "forwarders (rollout operator, sink writing)"
ENGINE_ACTOR = "engine actor (Ray calls, vLLM's front end)"
ENGINE_CORE = "vLLM engine core (scheduler, worker)"
OTHER_WORKERS = "other Ray workers (reads, idle)"
ROLES = (
    ("ray::StepGate", GATE),
    ("ray::MapWorker", FORWARDERS),
    ("ray::StandInEngine", "stand-in engines"),
    ("ray::VLLMEngine", ENGINE_ACTOR),
    ("VLLM::", ENGINE_CORE),  # the process vLLM starts for its engine core (under the actor, or a driver)
    ("ray::", OTHER_WORKERS),
)
DRIVER = "driver"
RAY_SYSTEM = "Ray system (GCS, raylet, agents)"


def role_of(process: psutil.Process, driver_pid: int) -> str:
    if process.pid == driver_pid:
        return DRIVER
    title = " ".join(process.cmdline())
    return next((role for prefix, role in ROLES if title.startswith(prefix)), RAY_SYSTEM)


def roles_of(processes: list[psutil.Process], driver_pid: int, known: dict[int, str]) -> dict[int, str]:
    """Each process's role, from `known` where it was settled: a Ray worker starts idle and takes its
    actor's title later, so only the generic roles are read again (reading every title each sample cost
    the driver, which is itself measured, a few percent of a core)."""
    for process in processes:
        if known.get(process.pid) in (None, OTHER_WORKERS, RAY_SYSTEM):
            try:
                known[process.pid] = role_of(process, driver_pid)
            except psutil.Error:  # ended meanwhile
                continue
    return known


class TreeCpu:
    """Samples the CPU times of the driver's process tree every `interval` seconds until `stop()`; a process
    that ends between samples is counted up to its last sample. `between()` gives a window's share."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.driver = psutil.Process(os.getpid())
        self.baseline: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU seconds at the last sample)
        self.history: list[tuple[float, dict[str, float]]] = []  # (time.time(), CPU seconds by role so far)
        self.roles: dict[int, str] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="benchmark-cpu", daemon=True)

    def start(self) -> TreeCpu:
        self.baseline = {pid: cpu for pid, (_, cpu) in self.sample().items()}
        self.thread.start()
        return self

    def sample(self) -> dict[int, tuple[str, float]]:
        seen = {}
        processes = [self.driver, *self.driver.children(recursive=True)]
        roles = roles_of(processes, self.driver.pid, self.roles)
        for process in processes:
            try:
                times = process.cpu_times()
                seen[process.pid] = (roles[process.pid], times.user + times.system)
            except (psutil.Error, KeyError):  # ended meanwhile: its last sample stands
                continue
        return seen

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.record()

    def record(self) -> None:
        with self.lock:  # the sampling thread and `now()` both record
            self.last.update(self.sample())
            by_role: dict[str, float] = {}
            for pid, (role, cpu) in self.last.items():
                by_role[role] = by_role.get(role, 0.0) + cpu - self.baseline.get(pid, 0.0)
            self.history.append((time.time(), by_role))

    def now(self) -> dict[str, float]:
        """CPU seconds by role since `start()`, sampled now: two of these bound a window exactly."""
        self.record()
        return self.history[-1][1]

    def stop(self) -> dict[str, float]:
        """CPU seconds by role since `start()`."""
        self.stopping.set()
        self.thread.join()
        self.record()
        return self.history[-1][1]

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds by role from the first sample at or after `start` to the last at or before `end`
        (wall-clock times, time.time())."""
        times = [t for t, _ in self.history]
        first = self.history[min(bisect.bisect_left(times, start), len(times) - 1)][1]
        last = self.history[max(bisect.bisect_right(times, end) - 1, 0)][1]
        return {role: last.get(role, 0.0) - first.get(role, 0.0) for role in last}
