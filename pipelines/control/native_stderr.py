"""Known native notices kept off the console: lines that C++ code writes straight to file descriptor 2, where
no Python logging level reaches them.

The one such line today is Ray's `core_worker.cc` error that a Ray Data `MapWorker` "has constructor arguments
in the object store and max_restarts > 0" (ray-project/ray#57733). Ray Data always puts its map function in
the object store and always lets its actors restart, so every actor pool prints it, and the only knob that
hides it (`RAY_BACKEND_LOG_LEVEL`) makes every Ray process print a line of its own instead. The driver's
C++ log file (`python-core-driver-*.log` in Ray's session logs) keeps the line whatever the console shows.

How: while a command runs, file descriptor 2 is a pipe read by a small child process, which copies every line
to the real stderr except the known notices. Python's own `sys.stderr` goes straight to the real stderr, so
progress bars still see a terminal. The child is in a session of its own (Ctrl-C does not end it) and reads
until every writer is gone, so a crash's last native lines (a Ray check failure before `abort()`) still reach
the console.

Kept to the standard library, like `console`.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator

KNOWN_NOTICES = (b"has constructor arguments in the object store and max_restarts > 0",)
CHILD_EXIT_WAIT_S = 5.0  # at the end, how long the child may take to copy what is left in the pipe

# The child: line by line from stdin to stdout, dropping lines that carry a known notice. What came before the
# notice on its line (a progress bar's text that had no newline) is kept.
FILTER_CHILD = """
import sys
notices = {notices!r}
out = sys.stdout.buffer
for line in iter(sys.stdin.buffer.readline, b""):
    for notice in notices:
        at = line.find(notice)
        if at >= 0:
            line = line[: max(line.rfind(b"[", 0, at), 0)]
            break
    if line:
        out.write(line)
        out.flush()
"""


@contextlib.contextmanager
def native_notices_filtered(active: bool = True) -> Iterator[None]:
    """Inside, native writes to stderr pass through the filter child (see the module's docstring). Does
    nothing unless `active` and `sys.stderr` is still the process's own stderr: under a test's capture, or
    when something else has replaced it, the console is not ours to rewire."""
    if not active or sys.stderr is not sys.__stderr__ or not _is_fd2(sys.stderr):
        yield
        return
    sys.stderr.flush()
    real = os.dup(2)  # the real stderr: the child writes there, and it comes back to fd 2 at the end
    child = subprocess.Popen(
        [sys.executable, "-I", "-c", FILTER_CHILD.format(notices=KNOWN_NOTICES)],
        stdin=subprocess.PIPE,
        stdout=real,
        start_new_session=True,
    )
    python_stderr = io.TextIOWrapper(
        os.fdopen(os.dup(real), "wb"),
        encoding=sys.stderr.encoding,
        errors="backslashreplace",
        line_buffering=True,
        write_through=True,
    )
    saved = sys.stderr
    os.dup2(child.stdin.fileno(), 2)
    sys.stderr = python_stderr
    try:
        yield
    finally:
        sys.stderr = saved
        python_stderr.flush()  # not closed: a bar or handler made inside may still hold it
        os.dup2(real, 2)
        os.close(real)
        child.stdin.close()
        # past the wait, a process started inside still holds the pipe: the child ends when that one does
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(CHILD_EXIT_WAIT_S)


def _is_fd2(stream: io.TextIOBase) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):
        return False
