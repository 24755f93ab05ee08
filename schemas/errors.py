"""Input errors that point at the exact place to fix: file, row (1-based line) and field; and the checks
of an input file made before anything opens it."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class InputError(ValueError):
    """A taskset or config problem, located precisely so the user can fix it without a traceback hunt."""

    def __init__(
        self, message: str, *, file: str | None = None, row: int | None = None, field: str | None = None
    ):
        self.file, self.row, self.field, self.reason = file, row, field, message
        where = []
        if file is not None:
            where.append(str(file) if row is None else f"{file}:{row}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class TaskInputError(ValueError):
    """A task whose input cannot run as it is (a prompt over the token limit): it fails at once, unretried."""


STALE = "stale:"  # the message prefix of a sub-run cancelled because it could no longer commit in time


class StaleRequest(RuntimeError):
    """A request the engine aborted after a sync: its tokens, sampled on a version more than `max_staleness`
    behind the trainer's newest, could never commit. Its sub-run ends at once, unretried, as stale."""


FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def file_problem(path: Path | str) -> str | None:
    """Why `path` is not a readable regular file (None: it is), found by `stat` without opening it, since
    opening a named pipe waits for a writer forever. Phrased to follow a noun: "taskset file not found"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "is a link to a missing file" if os.path.islink(path) else "not found"
    except (OSError, ValueError) as exc:  # ValueError: a NUL character in the path
        return f"cannot be read ({getattr(exc, 'strerror', None) or exc})"
    if not stat.S_ISREG(mode):
        kind = FILE_KINDS.get(stat.S_IFMT(mode), "a special file")
        return f"is {kind}, not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read (permission denied)"
    return None


def read_text(path: Path | str, max_mib: int, noun: str) -> str:
    """A small UTF-8 text file (config, model metadata), or an InputError naming it: a readable regular file
    (checked before it is opened) of at most `max_mib` MiB; a leading byte-order mark is dropped."""
    if problem := file_problem(path):
        raise InputError(f"{noun} {problem}", file=str(path))
    raw = b""
    try:
        with open(path, "rb") as handle:
            raw = handle.read((max_mib << 20) + 1)
        if len(raw) > max_mib << 20:
            raise InputError(f"{noun} is over {max_mib} MiB", file=str(path))
        return raw.decode("utf-8-sig")
    except OSError as exc:
        raise InputError(f"{noun} cannot be read ({exc.strerror or exc})", file=str(path)) from None
    except UnicodeDecodeError as exc:
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        hint = "it starts with a UTF-16 byte-order mark: save it as UTF-8" if utf16 else "save it as UTF-8"
        reason = f"not UTF-8 text ({exc.reason} at byte {exc.start}): {hint}"
        raise InputError(reason, file=str(path), row=raw[: exc.start].count(b"\n") + 1) from None
