"""Taskset files (jsonl / Parquet, a file or a directory) → Arrow batches of Task rows, with step numbers.

The driver first scans the taskset (`plan_taskset`), so a bad row fails the run before any engine starts and
before any step is committed; the Ray Data read then streams the same rows in bounded memory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.config import TasksetConfig
from schemas.errors import InputError
from schemas.task import ROLE_NAMES, TASK_SCHEMA, Task, make_task_uid

SUFFIXES = (".jsonl", ".json", ".parquet")
BLOCK_ROWS = 1024


def list_files(path: Path) -> list[Path]:
    """The taskset's files in a stable order; a directory contributes its jsonl/parquet files, sorted."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise InputError(f"no {'/'.join(SUFFIXES)} files in directory", file=str(path))
        return files
    if not path.exists():
        raise InputError("taskset file not found", file=str(path))
    if path.suffix not in SUFFIXES:
        raise InputError(
            f"unsupported taskset format '{path.suffix}' (use {', '.join(SUFFIXES)})", file=str(path)
        )
    return [path]


def iter_raw_rows(file: Path, skip_bad: bool = False) -> Iterator[tuple[int, dict[str, Any] | InputError]]:
    """(row number, record) pairs; jsonl rows are numbered by line (1-based), Parquet rows from 1.

    A line that is not a JSON object raises, or with `skip_bad` comes out as its InputError in place of a
    record, so the caller can count it and go on.
    """
    if file.suffix == ".parquet":
        number = 0
        try:
            parquet = pq.ParquetFile(file)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"not a readable Parquet file: {exc}", file=str(file)) from None
        for batch in parquet.iter_batches(batch_size=BLOCK_ROWS):
            for record in batch.to_pylist():
                number += 1
                yield number, record
        return
    with open(file, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                yield number, parse_line(raw, file, number)
            except InputError as error:
                if not skip_bad:
                    raise
                yield number, error


def parse_line(raw: bytes, file: Path, number: int) -> dict[str, Any]:
    try:
        record = json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(
            f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=str(file), row=number
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not valid JSON: {exc.msg} (column {exc.colno})", file=str(file), row=number
        ) from None
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {type(record).__name__}", file=str(file), row=number)
    return record


def extract_fields(
    record: dict[str, Any], cfg: TasksetConfig, file: Path, row: int
) -> tuple[str | None, list[dict[str, str]] | None, str]:
    """Prompt (or messages) and reference answer of one record, checked field by field."""
    fmt = cfg.format

    def fail(message: str, field: str) -> InputError:
        return InputError(message, file=str(file), row=row, field=field)

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
    else:
        prompt = record.get(fmt.prompt_key)
        if prompt is None:
            raise fail("missing", fmt.prompt_key)
        if not isinstance(prompt, str) or not prompt.strip():
            raise fail(f"expected a non-empty string, got {prompt!r:.60}", fmt.prompt_key)
    truth = record.get(fmt.response_key)
    if truth is None:
        raise fail("missing", fmt.response_key)
    if isinstance(truth, bool) or not isinstance(truth, str | int | float):
        raise fail(f"expected a string or number, got {type(truth).__name__}", fmt.response_key)
    if isinstance(truth, float) and not math.isfinite(truth):
        raise fail(f"expected a finite number, got {truth}", fmt.response_key)
    return prompt, messages, str(truth)


@dataclass(frozen=True)
class TasksetPlan:
    """How a validated taskset maps onto steps: positions run over epochs, `batch_size` per step."""

    files: tuple[tuple[str, int], ...]  # (path, rows) in read order
    batch_size: int
    total_epochs: int
    total_steps: int | None
    skipped: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (path, bad row numbers) with on_bad_row: skip
    skip_messages: tuple[str, ...] = ()  # the first few reasons, for the report

    @property
    def skipped_rows(self) -> int:
        return sum(len(rows) for _, rows in self.skipped)

    def skipped_in(self, file: str) -> frozenset[int]:
        return frozenset(dict(self.skipped).get(file, ()))

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
    for file in list_files(cfg.path):
        n, bad = 0, []
        for row, record in iter_raw_rows(file, skip_bad=skip):
            try:
                if isinstance(record, InputError):
                    raise record
                extract_fields(record, cfg, file, row)
            except InputError as error:
                if not skip:
                    raise
                bad.append(row)
                messages.append(str(error))
                continue
            n += 1
        counted.append((str(file), n))
        if bad:
            skipped.append((str(file), tuple(bad)))
    if not any(n for _, n in counted):
        more = f" usable rows ({len(messages)} bad ones skipped, e.g. {messages[0]})" if messages else " rows"
        raise InputError(f"the taskset has no{more}", file=str(cfg.path))
    return TasksetPlan(
        tuple(counted), batch_size, total_epochs, total_steps, tuple(skipped), tuple(messages[:3])
    )


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
    explore step they evaluate, instead of a step of their own.
    """
    file, _ = plan.files[file_index]
    offset = sum(n for _, n in plan.files[:file_index])
    first_position = (first_step - 1) * plan.batch_size
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
    pending: list[dict[str, Any]] = []
    index = offset
    bad = plan.skipped_in(file)
    for row, record in iter_raw_rows(Path(file), skip_bad=bool(bad)):
        if row in bad:
            continue
        position = epoch * plan.rows + index
        if position >= plan.total_tasks:
            break
        if position < first_position:
            index += 1
            continue
        prompt, messages, truth = extract_fields(record, cfg, Path(file), row)
        step = position // plan.batch_size + 1 if step_label is None else step_label
        if pending and pending[-1]["step"] != step:
            yield pa.Table.from_pylist(pending, schema=TASK_SCHEMA)
            pending = []
        uid = make_task_uid(cfg.name, epoch, index)
        task = Task(
            uid, epoch=epoch, index=index, step=step, prompt=prompt, messages=messages, truth=truth, **shared
        )
        pending.append(task.to_row())
        index += 1
    if pending:
        yield pa.Table.from_pylist(pending, schema=TASK_SCHEMA)


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
