"""Known native notices kept off the console (`pipelines.control.native_stderr`): a real child process reads
fd 2 through a pipe. Each case runs in a subprocess of its own: the filter rewires its process's fd 2."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from pipelines.control.native_stderr import native_notices_filtered

ROOT = Path(__file__).resolve().parents[2]
NOTICE = (
    b"[2026-12-07 06:27:49,880 E 1369 1578] core_worker.cc:2465: Actor with class name: 'MapWorker(x)' "
    b"has constructor arguments in the object store and max_restarts > 0. If the arguments ...\n"
)


def run(body: str) -> subprocess.CompletedProcess:
    script = "import os, sys\nfrom pipelines.control.native_stderr import native_notices_filtered\n" + body
    return subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60, env={**os.environ}
    )


def test_the_known_notice_is_dropped_and_everything_else_passes():
    done = run(
        "with native_notices_filtered():\n"
        f"    os.write(2, {NOTICE!r})\n"
        "    os.write(2, b'a real native error\\n')\n"
        "    os.write(2, b'\\rbar 50%' + " + repr(NOTICE) + ")\n"
        "    print('a python line', file=sys.stderr)\n"
        "print('after', file=sys.stderr)\n"
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    assert "constructor arguments" not in err
    assert "a real native error\n" in err
    assert "\rbar 50%" in err  # what came before the notice on its line is kept
    assert "a python line\n" in err and err.endswith("after\n")  # fd 2 and sys.stderr are back


def test_a_crash_still_shows_its_last_native_lines():
    done = run("with native_notices_filtered():\n    os.write(2, b'check failed: x\\n')\n    os.abort()\n")
    assert done.returncode == -6  # SIGABRT, as a Ray check failure ends
    assert b"check failed: x\n" in done.stderr  # the child drained the pipe after the writer died


def test_inactive_when_stderr_is_not_the_processes_own(monkeypatch):
    fd2 = os.fstat(2)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # as a test's capture or a notebook replaces it
    with native_notices_filtered():
        assert os.fstat(2).st_ino == fd2.st_ino
    with native_notices_filtered(active=False):
        assert os.fstat(2).st_ino == fd2.st_ino
