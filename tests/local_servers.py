"""Starting a server on 127.0.0.1 for a test: a free port, waiting until it answers (failing with its log
when it exits or is not up in time), and ending it. Shared by the MLflow server test and the object-store
tests' moto server (`tests/object_store.py`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port`."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def http_ok(url: str) -> bool:
    """Whether `url` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def wait_up(
    name: str, process: subprocess.Popen, up: Callable[[], bool], timeout: float, log: Path | None = None
) -> None:
    """Until `up()`; RuntimeError, with the end of the server's `log` when it has one, if the server exits
    first or is not up within `timeout` seconds (a test waiting on a dead server would wait out its own)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited at start with code {process.returncode}{tail(log)}")
        if up():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} not up after {timeout:.0f} s{tail(log)}")


def tail(log: Path | None) -> str:
    return "" if log is None else f":\n{log.read_text()[-3000:]}"


def end(process: subprocess.Popen, group: bool = False, grace: float = 10.0) -> None:
    """Terminate the server (its whole process group with `group`: one started with `start_new_session`),
    and kill it if it is still there after `grace` seconds."""
    send = (lambda sig: os.killpg(process.pid, sig)) if group else process.send_signal
    send(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait(timeout=grace)
