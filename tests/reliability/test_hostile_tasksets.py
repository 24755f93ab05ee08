"""Hostile tasksets: every bad row is refused with its file, line and field (`on_bad_row: raise`) or left out
and counted (`skip`), and the good rows around it come out in order with their step numbers. Nothing may end
in another exception (a bare traceback) or vanish uncounted.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators.tasks.reader import TasksetPlan, iter_task_tables, plan_taskset, read_units
from schemas.config import TasksetConfig
from schemas.errors import InputError

GOOD = [json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(6)]
BATCH = 3
MIB = 1 << 20


def write_lines(path: Path, lines: list[str | bytes], end: bytes = b"\n") -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + end for x in lines))
    return path


def planned(path: Path, **settings) -> tuple[TasksetConfig, TasksetPlan]:
    cfg = TasksetConfig(path=path, **settings)
    return cfg, plan_taskset(cfg, BATCH, 1, None)


def refusal(path: Path, **settings) -> InputError:
    with pytest.raises(InputError) as info:
        planned(path, **settings)
    return info.value


def read_rows(cfg: TasksetConfig, plan: TasksetPlan) -> list[dict]:
    return [
        row
        for unit in read_units(plan)
        for block in iter_task_tables(cfg, plan, *unit)
        for row in block.to_pylist()
    ]


def assert_good_rows_in_order(cfg: TasksetConfig, plan: TasksetPlan) -> None:
    """The six good rows, in file order, at positions 0..5, three to a step: nothing lost or shifted."""
    rows = read_rows(cfg, plan)
    assert [row["truth"] for row in rows] == [str(2 * i) for i in range(6)]
    assert [row["index"] for row in rows] == list(range(6))
    assert [row["step"] for row in rows] == [1, 1, 1, 2, 2, 2]


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# (bad line, field named, fragment of the reason); each goes on line 4, between good rows
BAD_LINES = {
    "malformed-json": ('{"prompt": "p", "answer": ', None, "not valid JSON"),
    "array": ("[1, 2]", None, "expected a JSON object, got array"),
    "number": ("42", None, "expected a JSON object, got number"),
    "null": ("null", None, "expected a JSON object, got null"),
    "string": ('"just text"', None, "expected a JSON object, got string"),
    "nested-100k-lists": (deep(100_000), None, "nested too deeply"),
    "nested-in-a-field": ('{"prompt": ' + deep(100_000) + ', "answer": "1"}', None, "nested too deeply"),
    "5000-digit-answer": ('{"prompt": "p", "answer": ' + "9" * 5000 + "}", None, "4300 digits"),
    "prompt-list": ('{"prompt": ["p"], "answer": "1"}', "prompt", "expected a non-empty string"),
    "prompt-nan": ('{"prompt": NaN, "answer": "1"}', "prompt", "expected a non-empty string, got nan"),
    "prompt-missing": ('{"question": "p", "answer": "1"}', "prompt", "missing"),
    "answer-dict": ('{"prompt": "p", "answer": {"a": 1}}', "answer", "string or number, got object"),
    "answer-nan": ('{"prompt": "p", "answer": NaN}', "answer", "finite number, got nan"),
    "answer-infinity": ('{"prompt": "p", "answer": -Infinity}', "answer", "finite number, got -inf"),
    "answer-1e999": ('{"prompt": "p", "answer": 1e999}', "answer", "finite number, got inf"),
    "lone-surrogate": ('{"prompt": "a\\ud800b", "answer": "1"}', "prompt", "not valid Unicode (surrogates"),
    "latin-1-bytes": (b'{"prompt": "caf\xe9", "answer": "1"}', None, "not UTF-8 text (invalid continuation"),
    "bom-mid-file": (b'\xef\xbb\xbf{"prompt": "p", "answer": "1"}', None, "Unexpected UTF-8 BOM"),
}


@pytest.mark.parametrize(("line", "field", "fragment"), BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_bad_line_is_refused_with_its_place_or_skipped_and_counted(tmp_path, line, field, fragment):
    path = write_lines(tmp_path / "t.jsonl", [*GOOD[:3], line, *GOOD[3:]])
    error = refusal(path)
    assert (error.file, error.row, error.field) == (str(path), 4, field)
    assert str(error).startswith(f"{path}:4") and fragment in error.reason

    cfg, plan = planned(path, on_bad_row="skip")
    assert plan.skipped_rows == 1 and list(plan.skipped_in(str(path))) == [4]
    assert plan.skip_messages == (str(error),)  # the same located reason, reported
    assert_good_rows_in_order(cfg, plan)


def test_every_bad_line_at_once_is_counted_and_only_three_reasons_are_kept(tmp_path):
    bad = [line for line, _, _ in BAD_LINES.values()]
    lines = [GOOD[0], *bad[:6], GOOD[1], GOOD[2], *bad[6:12], *GOOD[3:], *bad[12:]]
    path = write_lines(tmp_path / "t.jsonl", lines)
    cfg, plan = planned(path, on_bad_row="skip")
    assert plan.skipped_rows == len(bad) and plan.rows == 6
    assert len(plan.skip_messages) == 3
    assert_good_rows_in_order(cfg, plan)


def test_harmless_oddities_are_read_as_tasks(tmp_path):
    """A BOM on the first line, CRLF line ends, blank and whitespace lines, extra keys, non-ASCII text."""
    rows = [
        {"prompt": "¿Cuánto es 2 + 2? 🤔", "answer": 4, "extra": [1, {"x": None}]},
        *map(json.loads, GOOD),
    ]
    lines = [json.dumps(r, ensure_ascii=False).encode() for r in rows]
    path = write_lines(
        tmp_path / "t.jsonl", [b"\xef\xbb\xbf" + lines[0], b"", b"  \t", *lines[1:]], end=b"\r\n"
    )
    cfg, plan = planned(path)
    out = read_rows(cfg, plan)
    assert plan.rows == 7 and [r["truth"] for r in out] == ["4", *(str(2 * i) for i in range(6))]
    assert out[0]["prompt"] == "¿Cuánto es 2 + 2? 🤔"


# -- line length ---------------------------------------------------------------------------------------------


def line_of(nbytes: int) -> str:
    """A good row exactly `nbytes` long (without its newline)."""
    frame = '{"prompt": "", "answer": "1"}'
    return frame.replace('""', '"' + "x" * (nbytes - len(frame)) + '"', 1)


def test_max_row_bytes_is_the_longest_line_accepted(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [*GOOD[:3], line_of(1024), line_of(1025), *GOOD[3:]])
    error = refusal(path, max_row_bytes=1024)
    assert (error.row, error.field) == (5, None)
    assert error.reason == "line is longer than max_row_bytes=1024 (raise the limit, or split the row)"
    cfg, plan = planned(path, max_row_bytes=1024, on_bad_row="skip")
    assert (
        list(plan.skipped_in(str(path))) == [5]
        and "1025 bytes, more than max_row_bytes=1024" in plan.skip_messages[0]
    )
    assert plan.rows == 7


def traced(action: Callable[[], Any]) -> tuple[Any, int]:
    """What `action` returns, and the peak bytes Python allocated while it ran."""
    tracemalloc.start()
    try:
        return action(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_40_mib_line_over_the_limit_is_never_held_whole(tmp_path):
    huge = line_of(40 * MIB)
    refused_file = tmp_path / "raise.jsonl"
    refused_file.write_bytes(f"{GOOD[0]}\n{huge[: 20 * MIB]}".encode())  # its last line has no end
    skipped_file = write_lines(tmp_path / "skip.jsonl", [*GOOD[:3], huge, *GOOD[3:]])
    del huge

    error, peak = traced(lambda: refusal(refused_file, max_row_bytes=MIB))
    assert peak < 3 * MIB and error.row == 2
    assert error.reason == f"line is longer than max_row_bytes={MIB} (raise the limit, or split the row)"
    (cfg, plan), peak = traced(lambda: planned(skipped_file, max_row_bytes=MIB, on_bad_row="skip"))
    assert peak < 3 * MIB
    assert plan.skip_messages[0].startswith(
        f"{skipped_file}:4: line is {40 * MIB} bytes, more than max_row_bytes"
    )
    read_rows(*planned(write_lines(tmp_path / "warm.jsonl", GOOD)))  # Arrow imports pandas (27 MiB) once
    _, peak = traced(lambda: assert_good_rows_in_order(cfg, plan))
    assert peak < 3 * MIB


def test_a_10_mb_line_under_the_default_limit_is_one_task(tmp_path):
    prompt = "What is 1 + 1? " * (10_000_000 // 15)
    path = write_lines(
        tmp_path / "t.jsonl", [*GOOD[:3], json.dumps({"prompt": prompt, "answer": "2"}), *GOOD[3:]]
    )
    cfg, plan = planned(path)
    rows = read_rows(cfg, plan)
    assert plan.rows == 7 and rows[3]["prompt"] == prompt and rows[3]["step"] == 2


# -- whole files ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("on_bad_row", ["raise", "skip"])
def test_an_empty_taskset_file_is_refused(tmp_path, on_bad_row):
    path = write_lines(tmp_path / "empty.jsonl", [])
    error = refusal(path, on_bad_row=on_bad_row)
    assert (error.file, error.row, error.reason) == (str(path), None, "the taskset has no rows")


def test_an_empty_file_among_others_holds_no_tasks_and_shifts_nothing(tmp_path):
    """Nothing is lost: it has no rows (an empty last shard is common); the plan lists it with 0."""
    write_lines(tmp_path / "a.jsonl", GOOD[:2])
    write_lines(tmp_path / "b.jsonl", [])
    write_lines(tmp_path / "c.jsonl", GOOD[2:])
    cfg, plan = planned(tmp_path)
    assert [rows for _, rows in plan.files] == [2, 0, 4]
    assert_good_rows_in_order(cfg, plan)


def test_a_utf16_file_is_refused_with_a_hint_or_all_its_lines_counted(tmp_path):
    path = tmp_path / "utf16.jsonl"
    path.write_bytes("\n".join(GOOD).encode("utf-16"))  # with its byte-order mark
    error = refusal(path)
    assert error.row == 1 and "UTF-16 byte-order mark: save it as UTF-8" in error.reason
    error = refusal(path, on_bad_row="skip")
    assert error.reason.startswith("the taskset has no usable rows (6 bad ones skipped, e.g. ")
    assert "UTF-16" in error.reason


# -- Parquet -------------------------------------------------------------------------------------------------


def write_parquet(path: Path, columns: dict[str, list]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_a_parquet_file_without_the_answer_column(tmp_path):
    path = write_parquet(tmp_path / "q.parquet", {"prompt": ["a", "b", "c"], "solution": ["1", "2", "3"]})
    error = refusal(path)
    assert (error.file, error.row, error.field) == (str(path), None, "answer")
    assert error.reason == "no such column (it has: prompt, solution)"
    write_lines(tmp_path / "good.jsonl", GOOD)
    cfg, plan = planned(tmp_path, on_bad_row="skip")  # each of its rows is bad, and counted
    assert (
        list(plan.skipped_in(str(path))) == [1, 2, 3]
        and f"{path}:1, field 'answer': missing" in plan.skip_messages[0]
    )
    assert_good_rows_in_order(cfg, plan)


def test_parquet_rows_of_wrong_types_or_over_the_limit(tmp_path):
    columns = {
        "prompt": [f"What is {i} + {i}?" for i in range(6)] + ["x" * 2000, "p", "p"],
        "answer": [str(2 * i) for i in range(6)] + ["1", None, "y" * 1500],
    }
    path = write_parquet(tmp_path / "t.parquet", columns)
    error = refusal(path, max_row_bytes=1024)
    assert (error.row, error.field, error.reason) == (
        7,
        "prompt",
        "2000 bytes of text, more than max_row_bytes=1024",
    )
    cfg, plan = planned(path, max_row_bytes=1024, on_bad_row="skip")
    assert list(plan.skipped_in(str(path))) == [7, 8, 9]
    assert [m.split(": ", 1)[0] for m in plan.skip_messages] == [
        f"{path}:{n}, field '{f}'" for n, f in ((7, "prompt"), (8, "answer"), (9, "answer"))
    ]
    assert_good_rows_in_order(cfg, plan)
    binary = write_parquet(tmp_path / "binary.parquet", {"prompt": [b"bytes"], "answer": ["1"]})
    assert refusal(binary).reason == "expected a non-empty string, got b'bytes'"
