"""Taskset files (jsonl / Parquet, a file or a directory) → Arrow batches of Task rows, with step numbers.

The driver first scans the taskset (`plan_taskset`), so a bad row fails the run before any engine starts and
before any step is committed; the Ray Data read then streams the same rows in bounded memory.
"""

from __future__ import annotations

import json
import math
import os
import stat
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from operators.tasks.hf_dataset import dataset_files, is_dataset_dir
from schemas.config import TasksetConfig
from schemas.errors import InputError, file_problem
from schemas.task import ROLE_NAMES, TASK_SCHEMA, Task, make_task_uid

SUFFIXES = (".jsonl", ".json", ".parquet")
TABLE_SUFFIXES = (".parquet", ".arrow")  # read a batch at a time, with columns checked once per file
BLOCK_ROWS = 1024  # rows per block at most, whatever the step size
BLOCK_CHARS = 32 << 20  # and characters of prompt/answer text at most
SKIP_CHUNK = 1 << 18  # how much of an over-long line is read at a time while reading past it
SKIP_MESSAGES = 3  # reasons kept for the report; the rest are only counted


def taskset_files(cfg: TasksetConfig) -> list[Path]:
    """The taskset's files: a Hugging Face dataset folder's split (`operators.tasks.hf_dataset`) when the
    config names a subset or split, the path is a `save_to_disk` folder, or a missing one that may be a hub id
    (`openai/gsm8k`: refused with where to download it); else `list_files`."""
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


def extract_fields(
    record: dict[str, Any], cfg: TasksetConfig, file: Path, row: int
) -> tuple[str | None, list[dict[str, str]] | None, str]:
    """Prompt (or messages) and reference answer of one record, checked field by field."""
    fmt = cfg.format

    def fail(message: str, field: str) -> InputError:
        return InputError(message, file=str(file), row=row, field=field)

    def check_text(texts: list[str], field: str) -> None:
        if problem := text_problem(texts, cfg.max_row_bytes):
            raise fail(problem, field)

    prompt = messages = None
    if fmt.messages_key:
        messages = record.get(fmt.messages_key)
        if not isinstance(messages, list) or not messages:
            raise fail("missing or not a non-empty list of messages", fmt.messages_key)
        for i, message in enumerate(messages):
            ok = isinstance(message, dict) and message.get("role") in ROLE_NAMES
            if not ok or not isinstance(message.get("content"), str):
                raise fail(f"message {i} needs a role in {ROLE_NAMES} and string content", fmt.messages_key)
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        check_text([m["content"] for m in messages], fmt.messages_key)
    else:
        prompt = record.get(fmt.prompt_key)
        if prompt is None:
            raise fail("missing", fmt.prompt_key)
        if not isinstance(prompt, str) or not prompt.strip():
            raise fail(f"expected a non-empty string, got {prompt!r:.60}", fmt.prompt_key)
        check_text([prompt], fmt.prompt_key)
    truth = record.get(fmt.response_key)
    if truth is None:
        raise fail("missing", fmt.response_key)
    if isinstance(truth, bool) or not isinstance(truth, str | int | float):
        raise fail(f"expected a string or number, got {json_type(truth)}", fmt.response_key)
    if isinstance(truth, float) and not math.isfinite(truth):
        raise fail(f"expected a finite number, got {truth}", fmt.response_key)
    truth = str(truth)
    check_text([truth], fmt.response_key)
    return prompt, messages, truth


def text_problem(texts: list[str], limit: int) -> str | None:
    """What keeps these texts out of a task, if anything: Arrow cannot hold a lone surrogate (valid JSON:
    "\\ud800"), and a Parquet cell, unlike a jsonl line, has no line length to bound it."""
    size = 0
    for text in texts:
        if text.isascii():  # a flag CPython keeps: one byte a character, and no surrogates
            size += len(text)
            continue
        try:
            size += len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            return f"not valid Unicode ({exc.reason})"
    return f"{size} bytes of text, more than max_row_bytes={limit}" if size > limit else None


@dataclass(frozen=True)
class TasksetPlan:
    """How a validated taskset maps onto steps: positions run over epochs, `batch_size` per step."""

    files: tuple[tuple[str, int], ...]  # (path, rows) in read order
    batch_size: int
    total_epochs: int
    total_steps: int | None
    # (path, ascending bad row numbers) with on_bad_row: skip; 8 bytes a row, so a million cost 8 MB, not 36
    skipped: tuple[tuple[str, Sequence[int]], ...] = ()
    skip_messages: tuple[str, ...] = ()  # the first few reasons, for the report

    @property
    def skipped_rows(self) -> int:
        return sum(len(rows) for _, rows in self.skipped)

    def skipped_in(self, file: str) -> Sequence[int]:
        return dict(self.skipped).get(file, ())

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.files)

    @property
    def total_tasks(self) -> int:
        tasks = self.rows * self.total_epochs
        return tasks if self.total_steps is None else min(tasks, self.total_steps * self.batch_size)

    @property
    def num_steps(self) -> int:
        return -(-self.total_tasks // self.batch_size)

    def tasks_in_step(self, step: int) -> int:
        lo = (step - 1) * self.batch_size
        return max(0, min(self.batch_size, self.total_tasks - lo))


def plan_taskset(
    cfg: TasksetConfig, batch_size: int, total_epochs: int, total_steps: int | None
) -> TasksetPlan:
    """Validate every row (errors name file, row and field) and count rows per file.

    With `on_bad_row: skip`, a bad row is left out (it takes no position, so steps stay full) and recorded.
    """
    skip = cfg.on_bad_row == "skip"
    counted, skipped, messages = [], [], []
    for file in taskset_files(cfg):
        if file.suffix in TABLE_SUFFIXES and not skip:
            check_columns(file, cfg)
        n, bad = 0, array("q")
        for row, record in iter_raw_rows(file, cfg.max_row_bytes, skip_bad=skip):
            try:
                if isinstance(record, InputError):
                    raise record
                extract_fields(record, cfg, file, row)
            except InputError as error:
                if not skip:
                    raise
                bad.append(row)
                if len(messages) < SKIP_MESSAGES:
                    messages.append(str(error))
                continue
            n += 1
        counted.append((str(file), n))
        if bad:
            skipped.append((str(file), bad))
    if not any(n for _, n in counted):
        bad_rows = sum(len(rows) for _, rows in skipped)
        more = f" usable rows ({bad_rows} bad ones skipped, e.g. {messages[0]})" if messages else " rows"
        raise InputError(f"the taskset has no{more}", file=str(cfg.path))
    return TasksetPlan(tuple(counted), batch_size, total_epochs, total_steps, tuple(skipped), tuple(messages))


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


def iter_task_tables(
    cfg: TasksetConfig,
    plan: TasksetPlan,
    file_index: int,
    epoch: int,
    *,
    is_eval: bool = False,
    workflow: str | None = None,
    first_step: int = 1,
    step_label: int | None = None,
) -> Iterator[pa.Table]:
    """Task rows of one (file, epoch), cut at step boundaries so each block belongs to a single step.

    Steps before `first_step` (already committed, on resume) are skipped. Eval tasks carry `step_label`, the
    explore step they evaluate, instead of a step of their own. Rows go to Arrow a chunk at a time (at most
    BLOCK_ROWS rows and BLOCK_CHARS characters of text), sliced at steps: converting each small step on its
    own took longer than parsing the file.
    """
    file, _ = plan.files[file_index]
    index = sum(n for _, n in plan.files[:file_index])
    first_position = (first_step - 1) * plan.batch_size
    epoch_start, total_tasks = epoch * plan.rows, plan.total_tasks
    shared = {
        "taskset": cfg.name,
        "workflow": workflow or cfg.default_workflow_type or "math",
        "reward_fn": cfg.default_reward_fn_type or "",
        "repeat_times": cfg.repeat_times,
        "rollout_args": cfg.rollout_args.model_dump(),
        "workflow_args": cfg.workflow_args,
        "reward_fn_args": cfg.reward_fn_args,
        "is_eval": is_eval,
    }
    # Every row shares these columns: encoded once (Task.to_row's JSON), not once a row.
    template = Task("", epoch=epoch, index=0, step=0, prompt="", truth="", **shared).to_row()
    path = Path(file)
    bad = iter(plan.skipped_in(file))  # ascending, like the rows
    next_bad = next(bad, None)
    chunk: list[dict[str, Any]] = []
    chars = 0
    for row, record in iter_raw_rows(path, cfg.max_row_bytes, skip_bad=next_bad is not None):
        if row == next_bad:
            next_bad = next(bad, None)
            continue
        if isinstance(record, InputError):  # bad now but not when planned: the file has changed
            raise record
        position = epoch_start + index
        if position >= total_tasks:
            break
        if position >= first_position:
            prompt, messages, truth = extract_fields(record, cfg, path, row)
            step = position // plan.batch_size + 1 if step_label is None else step_label
            task = dict(template, task_uid=make_task_uid(cfg.name, epoch, index), index=index, step=step)
            task.update(prompt=prompt, messages=messages, truth=truth)
            chunk.append(task)
            chars += len(prompt or "") + len(truth) + sum(len(m["content"]) for m in messages or ())
            if len(chunk) == BLOCK_ROWS or chars >= BLOCK_CHARS:
                yield from cut_at_steps(chunk)
                chunk, chars = [], 0
        index += 1
    if chunk:
        yield from cut_at_steps(chunk)


def cut_at_steps(chunk: list[dict[str, Any]]) -> Iterator[pa.Table]:
    """The chunk as one table, yielded as slices (no copies) of one step each; steps ascend within a chunk."""
    table = pa.Table.from_pylist(chunk, schema=TASK_SCHEMA)
    start = 0
    for end in range(1, len(chunk) + 1):
        if end == len(chunk) or chunk[end]["step"] != chunk[start]["step"]:
            yield table.slice(start, end - start)
            start = end


def read_units(plan: TasksetPlan, first_step: int = 1) -> list[tuple[int, int]]:
    """(file, epoch) pairs holding at least one task of the plan from `first_step` on, in step order."""
    units, start = [], 0
    first_position = (first_step - 1) * plan.batch_size
    for epoch in range(plan.total_epochs):
        for file_index, (_, rows) in enumerate(plan.files):
            lo, hi = epoch * plan.rows + start, epoch * plan.rows + start + rows
            if rows and lo < plan.total_tasks and hi > first_position:
                units.append((file_index, epoch))
            start += rows
        start = 0
    return units
