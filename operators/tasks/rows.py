"""Taskset files → raw records: which files a taskset is, each opened without blocking and read in bounded
memory, and each row a record or, where it cannot be one (not UTF-8, not JSON, too long), an InputError that
names its file and row. What a record means is the reader's (`operators.tasks.reader`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from operators.tasks.hf_dataset import dataset_files, is_dataset_dir
from operators.tasks.reasoning_gym import generated_rows, source_name
from schemas.config import TasksetConfig
from schemas.errors import InputError, file_problem

SUFFIXES = (".jsonl", ".json", ".parquet")
TABLE_SUFFIXES = (".parquet", ".arrow")  # read a batch at a time, with columns checked once per file
BLOCK_ROWS = 1024  # rows per block at most, whatever the step size
SKIP_CHUNK = 1 << 18  # how much of an over-long line is read at a time while reading past it


def taskset_files(cfg: TasksetConfig) -> list[Path]:
    """The taskset's files: a Hugging Face dataset folder's split (`operators.tasks.hf_dataset`) when the
    config names a subset or split, the path is a `save_to_disk` folder, or a missing one that may be a hub id
    (`openai/gsm8k`: refused with where to download it); else `list_files`. A reasoning-gym taskset is one
    source named `reasoning_gym:<dataset>`, and no file."""
    if cfg.reasoning_gym is not None:
        return [Path(source_name(cfg.reasoning_gym))]
    path = Path(cfg.path)
    hub_id = not path.exists() and not path.suffix
    if cfg.subset_name is not None or cfg.split is not None or is_dataset_dir(path) or hub_id:
        return dataset_files(path, cfg.subset_name, cfg.split)
    return list_files(path)


def list_files(path: Path) -> list[Path]:
    """The taskset's files in a stable order; a directory contributes its jsonl/parquet files, sorted."""
    path = Path(path)
    if path.is_dir():
        try:
            found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and not p.is_dir())
        except OSError as exc:
            raise InputError(
                f"taskset directory cannot be read ({exc.strerror or exc})", file=str(path)
            ) from None
        for file in found:  # a named pipe would block the planning read for ever
            if problem := file_problem(file):
                raise InputError(f"taskset file {problem}", file=str(file))
        if not found:
            raise InputError(f"no {'/'.join(SUFFIXES)} files in directory", file=str(path))
        return found
    if problem := file_problem(path):
        raise InputError(f"taskset file {problem}", file=str(path))
    if path.suffix not in SUFFIXES:
        raise InputError(
            f"unsupported taskset format '{path.suffix}' (use {', '.join(SUFFIXES)})", file=str(path)
        )
    return [path]


def source_rows(
    cfg: TasksetConfig, file: Path, skip_bad: bool = False
) -> Iterator[tuple[int, dict[str, Any] | InputError]]:
    """The rows of one of `taskset_files(cfg)`: generated for a reasoning-gym taskset, else read."""
    if cfg.reasoning_gym is not None:
        return generated_rows(cfg.reasoning_gym, cfg.format, skip_bad)
    return iter_raw_rows(file, cfg.max_row_bytes, skip_bad)


def iter_raw_rows(
    file: Path, max_row_bytes: int, skip_bad: bool = False
) -> Iterator[tuple[int, dict[str, Any] | InputError]]:
    """(row number, record) pairs; jsonl rows are numbered by line (1-based), Parquet rows from 1.

    A line that is not a JSON object, or is longer than `max_row_bytes`, raises, or with `skip_bad` comes out
    as its InputError in place of a record, so the caller can count it and go on. No more than
    `max_row_bytes` of a line is ever held: a longer one is read past in bounded chunks.
    """
    if file.suffix == ".parquet":
        yield from enumerate(iter_parquet_records(file), start=1)
        return
    if file.suffix == ".arrow":
        yield from enumerate(iter_arrow_records(file), start=1)
        return
    try:
        yield from iter_jsonl_rows(file, max_row_bytes, skip_bad)
    except OSError as exc:  # a read error (EIO, a file truncated under us): the file, not a traceback
        raise InputError(f"taskset file cannot be read ({exc.strerror or exc})", file=str(file)) from None


def open_taskset_file(file: Path) -> BinaryIO:
    """`file` opened for reading, or an InputError naming it. Opened without blocking (a named pipe put in its
    place after planning would wait for a writer for ever) and refused unless it is a regular file."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError) as exc:  # PermissionError, FileNotFoundError; ValueError: a NUL in the path
        raise InputError(f"taskset file cannot be opened ({exc.strerror or exc})", file=str(file)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"taskset file {file_problem(file) or 'is not a regular file'}", file=str(file))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def iter_jsonl_rows(
    file: Path, max_row_bytes: int, skip_bad: bool
) -> Iterator[tuple[int, dict[str, Any] | InputError]]:
    """The jsonl part of `iter_raw_rows`."""
    with open_taskset_file(file) as handle:
        number = 0
        while raw := handle.readline(max_row_bytes + 1):
            number += 1
            if len(raw) > max_row_bytes and not raw.endswith(b"\n"):
                size = read_past_line(handle, len(raw)) if skip_bad else None
                error = overlong_line(file, number, max_row_bytes, size)
                if not skip_bad:
                    raise error
                yield number, error
                continue
            if not raw.strip():
                continue
            try:
                yield number, parse_line(raw, file, number)
            except InputError as error:
                if not skip_bad:
                    raise
                yield number, error


def iter_parquet_records(file: Path) -> Iterator[dict[str, Any]]:
    try:
        parquet = pq.ParquetFile(file)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"not a readable Parquet file: {exc}", file=str(file)) from None
    try:
        for batch in parquet.iter_batches(batch_size=BLOCK_ROWS):
            yield from batch.to_pylist()
    except (OSError, pa.ArrowException) as exc:  # a corrupt page, a read error
        raise InputError(f"not a readable Parquet file: {exc}", file=str(file)) from None


def iter_arrow_records(file: Path) -> Iterator[dict[str, Any]]:
    """An Arrow IPC stream (a `save_to_disk` data file), a batch at a time."""
    try:
        with pa.memory_map(str(file)) as source:
            for batch in pa.ipc.open_stream(source):
                yield from batch.to_pylist()
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"not a readable Arrow stream file: {exc}", file=str(file)) from None


def read_past_line(handle: BinaryIO, read: int) -> int:
    """Read past the rest of an over-long line a chunk at a time; returns its length without the newline."""
    while chunk := handle.readline(SKIP_CHUNK):
        read += len(chunk)
        if chunk.endswith(b"\n"):
            return read - 1
    return read


def overlong_line(file: Path, number: int, limit: int, size: int | None) -> InputError:
    """`size` is known when the line was read to its end (to skip it); refusing at once needs no more."""
    length = f"{size} bytes, more than" if size is not None else "longer than"
    return InputError(
        f"line is {length} max_row_bytes={limit} (raise the limit, or split the row)",
        file=str(file),
        row=number,
    )


def parse_line(raw: bytes, file: Path, number: int) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        utf16 = number == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        hint = " (the file starts with a UTF-16 byte-order mark: save it as UTF-8)" if utf16 else ""
        raise InputError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start}){hint}", file=str(file), row=number
        ) from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not valid JSON: {exc.msg} (column {exc.colno})", file=str(file), row=number
        ) from None
    except RecursionError:
        raise InputError("not readable JSON: nested too deeply", file=str(file), row=number) from None
    except ValueError as exc:  # an integer of more than sys.get_int_max_str_digits() digits
        raise InputError(f"not readable JSON: {exc}", file=str(file), row=number) from None
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {json_type(record)}", file=str(file), row=number)
    return record


JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (Parquet's others keep their Python names)."""
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


def check_columns(file: Path, cfg: TasksetConfig) -> None:
    """A Parquet file without a needed column fails once, naming it, rather than at each of its rows."""
    fmt = cfg.format
    try:
        if file.suffix == ".arrow":
            with pa.memory_map(str(file)) as source:
                names = pa.ipc.open_stream(source).schema.names
        else:
            names = pq.read_schema(file).names
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"not a readable {file.suffix[1:].title()} file: {exc}", file=str(file)) from None
    for key in (fmt.messages_key or fmt.prompt_key, fmt.response_key):
        if key not in names:
            raise InputError(f"no such column (it has: {', '.join(names)})", file=str(file), field=key)
