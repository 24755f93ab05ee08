"""Taskset files (jsonl / Parquet, a file or a directory) → Arrow batches of Task rows, with step numbers.

The driver first scans the taskset (`plan_taskset`), so a bad row fails the run before any engine starts and
before any step is committed; the Ray Data read then streams the same rows in bounded memory. The files and
their raw records come from `operators.tasks.rows`; here each record becomes a task's fields, and the tasks
are numbered into steps.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from operators.tasks.info import info_text
from operators.tasks.rows import (
    BLOCK_ROWS,
    TABLE_SUFFIXES,
    check_columns,
    json_type,
    source_rows,
    taskset_files,
)
from schemas.config import TasksetConfig
from schemas.errors import InputError
from schemas.task import ROLE_NAMES, TASK_SCHEMA, Task, make_task_uid

BLOCK_CHARS = 32 << 20  # characters of prompt/answer text in a block at most (and BLOCK_ROWS rows)
SKIP_MESSAGES = 3  # reasons kept for the report; the rest are only counted


def extract_fields(
    record: dict[str, Any], cfg: TasksetConfig, file: Path, row: int
) -> tuple[str | None, list[dict[str, str]] | None, str, str]:
    """Prompt (or messages), reference answer and info (JSON text) of one record, checked field by field."""
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
    info = "{}"
    if fmt.info_key:
        info = info_text(record.get(fmt.info_key), file, row, fmt.info_key, file.suffix in TABLE_SUFFIXES)
    return prompt, messages, truth, info


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
    epoch_tasks: int | None = None  # tasks an epoch holds when it is not the rows (several tasksets mixed)

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
        tasks = (self.epoch_tasks or self.rows) * self.total_epochs
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
        for row, record in source_rows(cfg, file, skip_bad=skip):
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
        source = str(cfg.path) if cfg.reasoning_gym is None else counted[0][0]
        raise InputError(f"the taskset has no{more}", file=source)
    return TasksetPlan(tuple(counted), batch_size, total_epochs, total_steps, tuple(skipped), tuple(messages))


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
    for row, record in source_rows(cfg, path, skip_bad=next_bad is not None):
        if row == next_bad:
            next_bad = next(bad, None)
            continue
        if isinstance(record, InputError):  # bad now but not when planned: the file has changed
            raise record
        position = epoch_start + index
        if position >= total_tasks:
            break
        if position >= first_position:
            prompt, messages, truth, info = extract_fields(record, cfg, path, row)
            step = position // plan.batch_size + 1 if step_label is None else step_label
            task = dict(template, task_uid=make_task_uid(cfg.name, epoch, index), index=index, step=step)
            task.update(prompt=prompt, messages=messages, truth=truth, info=info)
            chunk.append(task)
            chars += len(prompt or "") + len(truth) + len(info)
            chars += sum(len(m["content"]) for m in messages or ())
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
