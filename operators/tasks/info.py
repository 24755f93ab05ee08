"""A taskset row's `info`: the task's own data beyond prompt and answer, checked before it becomes a task.

It must be a JSON object (a jsonl object, a Parquet/Arrow struct, or, since those formats have no JSON type,
a string column holding a JSON object's text), and at most MAX_INFO_BYTES once serialized: it rides in every
task row and every experience of the task, so an unbounded one would cost memory and sink space per sample.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from operators.tasks.rows import json_type
from schemas.errors import InputError

MAX_INFO_BYTES = 64 << 10  # serialized (UTF-8 JSON); a scorer's metadata is far smaller


def info_text(value: Any, file: Path | str, row: int, field: str, from_table: bool) -> str:
    """The row's `info` as canonical JSON text (`{}` when absent or null), or an InputError naming the file,
    row and field. `from_table`: a string is read as JSON text (Parquet and Arrow hold no JSON objects)."""

    def fail(message: str) -> InputError:
        return InputError(message, file=str(file), row=row, field=field)

    if value is None:
        return "{}"
    if from_table and isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise fail("a string column must hold a JSON object's text, and this is not JSON") from None
    if not isinstance(value, dict):
        raise fail(f"expected a JSON object, got {json_type(value)}")
    try:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:  # a Parquet date or bytes, a NaN, a non-string key
        raise fail(f"not JSON-representable: {exc}") from None
    except RecursionError:
        raise fail("nested too deeply") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800" is valid JSON): Arrow cannot hold it
        raise fail(f"not valid Unicode ({exc.reason})") from None
    if size > MAX_INFO_BYTES:
        raise fail(f"{size} bytes as JSON, more than the {MAX_INFO_BYTES} an info may hold")
    return text
