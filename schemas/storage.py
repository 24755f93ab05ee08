"""Where a run's files live: a local folder, or a prefix on an object store that every node can reach.

A location is a `Path` (local) or, for an object store, the URI text as given: `s3://bucket/prefix`,
`gs://bucket/prefix`, with pyarrow's options in the query (`s3://bucket/run?endpoint_override=host:9000&
scheme=http&region=us-east-1`). The URI stays text because `Path` would fold its `//`, and because Ray workers
on other nodes open the same store again from it. Credentials come from the store's usual chain
(`AWS_ACCESS_KEY_ID`..., a service account), or from the URI (`s3://KEY:SECRET@bucket/...`), which `display`
masks.

Object stores have no folders and no rename: what needs a rename on a disk (a commit) uses a marker object
written last instead (`schemas.atomic.write_commit_marker`). Every function here takes either kind, so callers
branch only where the two really differ.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs

Location = Path | str  # a local path, or an object-store URI kept as text


def is_remote(location: Location | os.PathLike[str]) -> bool:
    """True for a URI with a scheme other than `file` (`s3://`, `gs://`, ...); False for a local path."""
    if isinstance(location, os.PathLike):
        return False
    scheme = urlsplit(str(location)).scheme
    return "://" in str(location) and len(scheme) > 1 and scheme != "file"  # `C:\` is a drive, not a scheme


def as_location(text: str | os.PathLike[str]) -> Location:
    """An object-store URI as it is (text), anything else as a `Path`."""
    return str(text) if is_remote(text) else Path(text)


def join(location: Location, *parts: str) -> Location:
    """`location / part / ...`; on a URI the parts go into its path, before any query."""
    if not is_remote(location):
        return Path(location).joinpath(*parts)
    url = urlsplit(str(location))
    path = "/".join([url.path.rstrip("/"), *(p.strip("/") for p in parts)])
    return urlunsplit((url.scheme, url.netloc, path, url.query, url.fragment))


def base_name(location: Location) -> str:
    """The last component: a run dir's name is its run's name."""
    if not is_remote(location):
        return Path(location).name
    url = urlsplit(str(location))
    return PurePosixPath(url.path).name or url.netloc.rpartition("@")[2]


def display(location: Location) -> str:
    """The location for messages and logs, with any credentials in a URI masked."""
    if not is_remote(location):
        return str(location)
    url = urlsplit(str(location))
    netloc = url.netloc if "@" not in url.netloc else f"***@{url.netloc.rpartition('@')[2]}"
    return urlunsplit((url.scheme, netloc, url.path, url.query, url.fragment))


@functools.lru_cache(maxsize=16)
def store_filesystem(root_uri: str) -> pafs.FileSystem:
    """One filesystem per store (a URI without its path): a process opens an S3 client once, not per call."""
    fs, _ = pafs.FileSystem.from_uri(root_uri)
    return fs


def filesystem(location: Location) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem holding `location` and the path in its own terms (`bucket/prefix/...`)."""
    if not is_remote(location):
        return pafs.LocalFileSystem(), str(Path(location).absolute())
    url = urlsplit(str(location))
    fs = store_filesystem(urlunsplit((url.scheme, url.netloc, "", url.query, "")))
    host = url.netloc.rpartition("@")[2]
    return fs, f"{host}{url.path}".rstrip("/")


def file_type(location: Location) -> pafs.FileType:
    fs, path = filesystem(location)
    return fs.get_file_info(path).type


def is_file(location: Location) -> bool:
    return file_type(location) == pafs.FileType.File


def children(location: Location, kind: pafs.FileType) -> list[str]:
    """The names of the files (or folders) directly in `location`; none when it does not exist."""
    fs, path = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(info.base_name for info in infos if info.type == kind)


def read_bytes(location: Location) -> bytes:
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as stream:
        return stream.read()


def open_input(location: Location) -> pafs.NativeFile:
    """A random-access file (what Parquet reads) at `location`."""
    fs, path = filesystem(location)
    return fs.open_input_file(path)


def make_dirs(location: Location) -> None:
    """A local folder and its parents; nothing on an object store, where a folder is only a key prefix."""
    if not is_remote(location):
        Path(location).mkdir(parents=True, exist_ok=True)


def delete_file(location: Location) -> None:
    fs, path = filesystem(location)
    fs.delete_file(path)


def delete_tree(location: Location) -> None:
    """`location` and everything under it; nothing when it is not there."""
    fs, path = filesystem(location)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir(path)


def copy_file(src: Location, dst: Location) -> None:
    """A copy within one store (a server-side copy on an object store: the data does not travel here)."""
    fs, src_path = filesystem(src)
    _, dst_path = filesystem(dst)
    fs.copy_file(src_path, dst_path)


@contextlib.contextmanager
def fetched(location: Location) -> Iterator[Path]:
    """A local file with the content of `location`: the file itself when local, else a temporary copy."""
    if not is_remote(location):
        yield Path(location)
        return
    with tempfile.TemporaryDirectory(prefix="rftflow-") as tmp:
        local = Path(tmp) / base_name(location)
        local.write_bytes(read_bytes(location))
        yield local
