"""Atomic, durable writes: every state, status and checkpoint file goes through here.

A reader (or a resumed run) must see a file whole or not at all. Writing in place is never safe: a crash, a
kill or a full disk halfway leaves half a file, and the next `json.loads` fails or, worse, reads a shorter
file that still parses. So a file is written to a sibling temp file in the same directory (same filesystem,
so the rename is atomic), flushed and fsynced, then `os.replace`d onto the target, and finally the directory
is fsynced. After a crash the target is the old file or the new one, never half of either; the fsyncs make a
power loss do the same (without them the rename may reach the disk before the data, leaving an empty file).

Temp files are named `.<name>.<random>.partial`: hidden from dataset readers, never a name a reader globs,
and removed when the write fails. One left by a killed process is harmless and may be deleted.

On an object store (a `schemas.storage` URI) there is no rename, but there is no half object either: an
upload becomes visible whole when it completes, or not at all. So a file is built in memory and uploaded in
one piece, never streamed while the caller still writes (an exception in the caller's block would otherwise
publish what was written so far). What needs several objects to appear at once (a step's fragments) is
written first and published by a marker object written last (`write_commit_marker`): readers honour only
folders with a marker, and a crash before it leaves files no reader sees, redone on resume.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from schemas.storage import Location, filesystem, is_file, is_remote, join, read_bytes

COMMIT_MARKER = "_COMMITTED"  # `_`: dataset readers skip it, as they skip Hadoop's `_SUCCESS`

# Filesystems that cannot fsync a directory (some network and FUSE mounts) say so with these.
UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def temp_path(path: Path) -> Path:
    """A fresh sibling of `path` to write aside: same directory, so `os.replace` onto `path` is atomic."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.partial")


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (a rename, a new or removed file) durable; a no-op where unsupported."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        if exc.errno in UNSUPPORTED or os.name == "nt":  # Windows cannot open a directory
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in UNSUPPORTED:
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "wb", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """A file to write `path` through: it replaces `path` atomically and durably when the block ends.

    If the block raises, the temp file is removed and `path` is left as it was. New files get the usual
    permissions (0666 less the umask), as a plain `open` would give them.
    """
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes a whole file: mode must be 'w' or 'wb', not {mode!r}")
    if is_remote(path):
        with upload_on_success(str(path), mode, open_kwargs.get("encoding", "utf-8")) as f:
            yield f
        return
    path = Path(path)
    temp = temp_path(path)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with open(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    fsync_dir(path.parent)


@contextlib.contextmanager
def upload_on_success(location: str, mode: str, encoding: str) -> Iterator[IO[Any]]:
    """An in-memory file uploaded to `location` in one piece once the block ends; nothing if it raises."""
    buffer = io.BytesIO() if "b" in mode else io.StringIO()
    yield buffer
    data = buffer.getvalue()
    put_object(location, data if isinstance(data, bytes) else data.encode(encoding))


def put_object(location: Location, data: bytes) -> None:
    """One object, uploaded whole: an object store shows it complete or not at all."""
    fs, path = filesystem(location)
    with fs.open_output_stream(path) as out:
        out.write(data)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically and durably: afterwards `path` is the old file or the new, whole."""
    if is_remote(path):
        put_object(str(path), data)
        return
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Write `text` to `path` atomically and durably (see `atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, **dumps_kwargs: Any) -> None:
    """`json.dumps(obj, **dumps_kwargs)` written to `path` atomically and durably (see `atomic_write_bytes`).

    The object is serialised before anything is written, so one that cannot be leaves `path` untouched.
    """
    atomic_write_text(path, json.dumps(obj, **dumps_kwargs))


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (itself included), deepest first."""
    for directory, _, files in os.walk(root, topdown=False):
        for name in files:
            file = Path(directory) / name
            if file.is_symlink():
                continue
            with open(file, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(directory))


def atomic_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Publish an already-written file or directory `src` (beside `dst`) as `dst`, atomically and durably.

    `src` is fsynced first (for a directory: every file and folder in it), then renamed onto `dst` with
    `os.replace`, then the parent directory is fsynced. Guarantees: a reader sees `dst` absent (or the old
    file) or the whole of `src`, never a part of it, even after a crash or a power loss once this returns.
    A directory `dst` must be absent or empty (`os.replace` cannot replace a non-empty directory): remove an
    older copy first; a crash between the two then leaves no `dst` rather than half of one.
    """
    src, dst = Path(src), Path(dst)
    if src.is_dir():
        fsync_tree(src)
    else:
        with open(src, "rb") as f:
            os.fsync(f.fileno())
    os.replace(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)


def write_commit_marker(folder: Location, names: set[str] | list[str]) -> None:
    """Publish the files `names` of `folder` (already written) by writing its commit marker, last.

    The marker lists the files, so a reader takes exactly those: a file left in the folder by an earlier,
    crashed attempt is never read.
    """
    atomic_write_json(join(folder, COMMIT_MARKER), {"files": sorted(names)})


def committed_files(folder: Location) -> list[str] | None:
    """The files `folder`'s commit marker publishes, or None when it has none (not committed)."""
    marker = join(folder, COMMIT_MARKER)
    if not is_file(marker):
        return None
    return list(json.loads(read_bytes(marker))["files"])
