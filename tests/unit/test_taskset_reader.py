"""Taskset reader: files → validated plan → Task tables cut at step boundaries.

Bad input fails with an InputError naming file, line (row) and field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from unit_factories import qa_rows

from operators.tasks.reader import TasksetPlan, iter_task_tables, plan_taskset, read_units
from operators.tasks.rows import list_files
from schemas.config import FormatConfig, RolloutArgs, TasksetConfig
from schemas.errors import InputError
from schemas.task import TASK_SCHEMA, tasks_from_table


def config(path: Path, **kwargs) -> TasksetConfig:
    return TasksetConfig(path=path, **kwargs)


def plan_for(
    cfg: TasksetConfig, batch_size: int = 4, epochs: int = 1, total_steps: int | None = None
) -> TasksetPlan:
    return plan_taskset(cfg, batch_size, epochs, total_steps)


def read_all(cfg: TasksetConfig, plan: TasksetPlan) -> list[pa.Table]:
    """Every block of the plan, in read order, as the Ray Data read would produce them."""
    return [block for unit in read_units(plan) for block in iter_task_tables(cfg, plan, *unit)]


def column(blocks: list[pa.Table], name: str) -> list:
    return [value for block in blocks for value in block.column(name).to_pylist()]


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def refused(cfg: TasksetConfig) -> InputError:
    with pytest.raises(InputError) as info:
        plan_for(cfg)
    return info.value


def assert_located(err: InputError, file: Path, row: int | None, field: str | None, fragment: str) -> None:
    """The error names the file, the (1-based, physical) row and the field, and says what is wrong."""
    assert err.file == str(file)
    assert err.row == row
    assert err.field == field
    text = str(err)
    assert (f"{file}:{row}" if row is not None else str(file)) in text
    if field is not None:
        assert f"field '{field}'" in text
    assert fragment in text


# --- plans and row counts -----------------------------------------------------------------------------------


def test_plan_counts_jsonl_rows_skipping_blank_lines(write_jsonl):
    path = write_jsonl([*qa_rows(3), "", "   ", *qa_rows(2, start=3)])
    plan = plan_for(config(path))
    assert plan.files == ((str(path), 5),)
    assert plan.rows == plan.total_tasks == 5


def test_parquet_taskset_is_read_with_numeric_answers_stringified(tmp_path):
    path = write_parquet(
        tmp_path / "t.parquet", [{"prompt": "a?", "answer": 68}, {"prompt": "b?", "answer": 2}]
    )
    cfg = config(path)
    plan = plan_for(cfg)
    assert plan.rows == 2
    assert column(read_all(cfg, plan), "truth") == ["68", "2"]


def test_directory_reads_taskset_files_in_sorted_order(tmp_path, write_jsonl):
    write_jsonl(qa_rows(3, start=10), name="d/b.jsonl")
    write_jsonl(qa_rows(2), name="d/a.jsonl")
    write_parquet(tmp_path / "d" / "c.parquet", qa_rows(4, start=20))
    (tmp_path / "d" / "notes.txt").write_text("not a taskset")
    (tmp_path / "d" / "sub.jsonl").mkdir()  # a directory with a taskset suffix is not a file
    directory = tmp_path / "d"
    assert [p.name for p in list_files(directory)] == ["a.jsonl", "b.jsonl", "c.parquet"]
    cfg = config(directory)
    plan = plan_for(cfg, batch_size=4)
    assert [n for _, n in plan.files] == [2, 3, 4]
    assert plan.rows == 9 and plan.num_steps == 3
    blocks = read_all(cfg, plan)
    assert column(blocks, "index") == list(range(9))  # indices run on across files
    assert column(blocks, "truth")[:3] == ["1", "2", "11"]
    assert column(blocks, "step") == [1] * 4 + [2] * 4 + [3]


# --- steps --------------------------------------------------------------------------------------------------


def test_steps_follow_batch_size_with_a_final_partial_step(write_jsonl):
    cfg = config(write_jsonl(qa_rows(10)))
    plan = plan_for(cfg, batch_size=4)
    assert plan.num_steps == 3
    assert [plan.tasks_in_step(s) for s in range(1, 5)] == [4, 4, 2, 0]
    blocks = read_all(cfg, plan)
    assert column(blocks, "step") == [1] * 4 + [2] * 4 + [3] * 2
    assert [len(b) for b in blocks] == [4, 4, 2]
    assert all(b.schema.equals(TASK_SCHEMA) for b in blocks)


def test_blocks_never_span_two_steps_even_across_files(write_jsonl, tmp_path):
    write_jsonl(qa_rows(3), name="d/a.jsonl")
    write_jsonl(qa_rows(7, start=3), name="d/b.jsonl")
    cfg = config(tmp_path / "d")
    plan = plan_for(cfg, batch_size=4)
    per_unit = [
        [b.column("step").to_pylist() for b in iter_task_tables(cfg, plan, *u)] for u in read_units(plan)
    ]
    assert per_unit == [[[1, 1, 1]], [[1], [2, 2, 2, 2], [3, 3]]]


def test_total_steps_caps_the_plan_across_epochs(write_jsonl):
    cfg = config(write_jsonl(qa_rows(10)))
    plan = plan_for(cfg, batch_size=4, epochs=3, total_steps=4)
    assert plan.total_tasks == 16 and plan.num_steps == 4
    assert plan.tasks_in_step(4) == 4 and plan.tasks_in_step(5) == 0
    assert read_units(plan) == [(0, 0), (0, 1)]  # epoch 2 holds no task of the plan
    blocks = read_all(cfg, plan)
    assert column(blocks, "step") == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
    assert column(blocks, "epoch") == [0] * 10 + [1] * 6


def test_total_steps_beyond_the_data_keeps_all_epochs(write_jsonl):
    plan = plan_for(config(write_jsonl(qa_rows(10))), batch_size=4, epochs=2, total_steps=100)
    assert plan.total_tasks == 20 and plan.num_steps == 5
    assert [plan.tasks_in_step(s) for s in range(1, 6)] == [4, 4, 4, 4, 4]


def test_epochs_have_distinct_uids_that_are_stable_across_reads(write_jsonl):
    cfg = config(write_jsonl(qa_rows(5)))
    plan = plan_for(cfg, batch_size=2, epochs=2)
    first, again = read_all(cfg, plan), read_all(cfg, plan)
    assert [b.to_pylist() for b in first] == [b.to_pylist() for b in again]
    uids = column(first, "task_uid")
    assert len(set(uids)) == 10
    assert uids[:5] == [f"arith/e0/{i}" for i in range(5)]
    assert uids[5:] == [f"arith/e1/{i}" for i in range(5)]
    assert column(first, "prompt")[:5] == column(first, "prompt")[5:]
    # epoch 1 continues the step numbering: 5 rows, batch 2 -> epoch 0 ends inside step 3
    assert column(first, "step") == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_read_units_skip_empty_files_and_capped_epochs(write_jsonl, tmp_path):
    write_jsonl(qa_rows(4), name="d/a.jsonl")
    write_jsonl([], name="d/b.jsonl")
    write_jsonl(qa_rows(4, start=4), name="d/c.jsonl")
    cfg = config(tmp_path / "d")
    assert read_units(plan_for(cfg, batch_size=4, epochs=2)) == [(0, 0), (2, 0), (0, 1), (2, 1)]
    assert read_units(plan_for(cfg, batch_size=4, epochs=2, total_steps=1)) == [(0, 0)]
    assert read_units(plan_for(cfg, batch_size=4, epochs=2, total_steps=3)) == [(0, 0), (2, 0), (0, 1)]


def test_task_rows_carry_the_taskset_settings(write_jsonl):
    cfg = config(
        write_jsonl(qa_rows(2)),
        name="mine",
        repeat_times=3,
        rollout_args=RolloutArgs(temperature=0.5, max_tokens=7),
        default_workflow_type="wf",
        default_reward_fn_type="format",
        reward_fn_args={"x": 1},
    )
    plan = plan_for(cfg)
    tasks = tasks_from_table(next(iter_task_tables(cfg, plan, 0, 0, is_eval=True)))
    task = tasks[1]
    assert (task.task_uid, task.taskset, task.index, task.step) == ("mine/e0/1", "mine", 1, 1)
    assert (task.prompt, task.truth, task.messages) == ("What is 1 + 1?", "2", None)
    assert (task.workflow, task.reward_fn, task.repeat_times, task.is_eval) == ("wf", "format", 3, True)
    assert task.rollout_args["temperature"] == 0.5 and task.rollout_args["max_tokens"] == 7
    assert task.reward_fn_args == {"x": 1}


# --- field formats ------------------------------------------------------------------------------------------


def test_numeric_answers_are_accepted_and_stringified(write_jsonl):
    cfg = config(write_jsonl([{"prompt": "a", "answer": 68}, {"prompt": "b", "answer": 2.5}]))
    assert column(read_all(cfg, plan_for(cfg)), "truth") == ["68", "2.5"]


def test_custom_prompt_and_response_keys(write_jsonl):
    path = write_jsonl([{"question": "What is 2 + 2?", "solution": "4", "prompt": "ignored"}])
    cfg = config(path, format=FormatConfig(prompt_key="question", response_key="solution"))
    blocks = read_all(cfg, plan_for(cfg))
    assert column(blocks, "prompt") == ["What is 2 + 2?"]
    assert column(blocks, "truth") == ["4"]
    missing = write_jsonl([{"question": "q", "answer": "4"}], name="missing.jsonl")
    err = refused(config(missing, format=FormatConfig(prompt_key="question", response_key="solution")))
    assert_located(err, missing, 1, "solution", "missing")


def test_messages_key_reads_chat_messages(write_jsonl):
    chat = [{"role": "system", "content": "terse"}, {"role": "user", "content": "1+1?", "extra": "dropped"}]
    cfg = config(write_jsonl([{"chat": chat, "answer": "2"}]), format=FormatConfig(messages_key="chat"))
    task = tasks_from_table(read_all(cfg, plan_for(cfg))[0])[0]
    assert task.prompt is None
    assert task.messages == [{"role": "system", "content": "terse"}, {"role": "user", "content": "1+1?"}]


@pytest.mark.parametrize(
    ("chat", "fragment"),
    [
        ([{"role": "user", "content": "ok"}, {"role": "robot", "content": "hi"}], "message 1 needs a role"),
        ([{"role": "user", "content": 3}], "message 0 needs a role"),
        ([], "non-empty list"),
        ("just text", "non-empty list"),
    ],
    ids=["bad-role", "non-string-content", "empty", "not-a-list"],
)
def test_bad_messages_are_refused(write_jsonl, chat, fragment):
    path = write_jsonl(
        [{"chat": [{"role": "user", "content": "fine"}], "answer": "1"}, {"chat": chat, "answer": "1"}]
    )
    err = refused(config(path, format=FormatConfig(messages_key="chat")))
    assert_located(err, path, 2, "chat", fragment)


# --- bad input ----------------------------------------------------------------------------------------------

GOOD = json.dumps({"prompt": "p", "answer": "1"})


@pytest.mark.parametrize(
    ("lines", "row", "field", "fragment"),
    [
        ([GOOD, "", '{"prompt": "p", "answer": '], 3, None, "not valid JSON"),
        ([GOOD, '{"answer": "1"}'], 2, "prompt", "missing"),
        ([GOOD, '{"prompt": "p"}'], 2, "answer", "missing"),
        ([GOOD, '{"prompt": "p", "answer": null}'], 2, "answer", "missing"),
        ([GOOD, GOOD, "[1, 2]"], 3, None, "expected a JSON object, got array"),
        (['"just a string"'], 1, None, "expected a JSON object, got string"),
        ([GOOD, '{"prompt": "   ", "answer": "1"}'], 2, "prompt", "non-empty string"),
        ([GOOD, '{"prompt": 5, "answer": "1"}'], 2, "prompt", "non-empty string"),
        ([GOOD, '{"prompt": "p", "answer": true}'], 2, "answer", "string or number, got boolean"),
        ([GOOD, '{"prompt": "p", "answer": [1]}'], 2, "answer", "string or number, got array"),
    ],
    ids=[
        "malformed-json",
        "no-prompt",
        "no-answer",
        "null-answer",
        "array-line",
        "string-line",
        "blank-prompt",
        "numeric-prompt",
        "bool-answer",
        "list-answer",
    ],
)
def test_bad_jsonl_rows_are_located(write_jsonl, lines, row, field, fragment):
    path = write_jsonl(lines)
    assert_located(refused(config(path)), path, row, field, fragment)


def test_non_utf8_bytes_are_located(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + '{"prompt": "caf\xe9", "answer": "1"}\n'.encode("latin-1"))
    assert_located(refused(config(path)), path, 2, None, "not UTF-8")


def test_parquet_rows_are_located(tmp_path):
    path = write_parquet(
        tmp_path / "t.parquet", [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}]
    )
    assert_located(refused(config(path)), path, 2, "answer", "missing")
    no_column = write_parquet(tmp_path / "u.parquet", [{"prompt": "a"}])
    assert_located(refused(config(no_column)), no_column, None, "answer", "no such column (it has: prompt)")


@pytest.mark.parametrize("lines", [[], ["", "  "]], ids=["empty", "blank-lines"])
def test_a_taskset_without_rows_is_refused(write_jsonl, lines):
    path = write_jsonl(lines)
    assert_located(refused(config(path)), path, None, None, "no rows")


def test_missing_file_is_refused(tmp_path):
    path = tmp_path / "nope.jsonl"
    assert_located(refused(config(path)), path, None, None, "not found")


def test_unsupported_suffix_is_refused(tmp_path):
    path = tmp_path / "tasks.csv"
    path.write_text("prompt,answer\np,1\n")
    assert_located(refused(config(path)), path, None, None, "unsupported taskset format '.csv'")


def test_directory_without_taskset_files_is_refused(tmp_path):
    directory = tmp_path / "empty"
    directory.mkdir()
    (directory / "readme.md").write_text("no tasks here")
    assert_located(refused(config(directory)), directory, None, None, "files in directory")


def test_directory_of_empty_files_has_no_rows(write_jsonl, tmp_path):
    write_jsonl([], name="d/a.jsonl")
    assert_located(refused(config(tmp_path / "d")), tmp_path / "d", None, None, "no rows")


def test_a_bad_row_in_a_later_file_names_that_file(write_jsonl, tmp_path):
    write_jsonl(qa_rows(3), name="d/a.jsonl")
    bad = write_jsonl([*qa_rows(4), '{"prompt": "p"}'], name="d/b.jsonl")
    assert_located(refused(config(tmp_path / "d")), bad, 5, "answer", "missing")


def test_corrupt_parquet_file_is_an_input_error(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet")
    assert_located(refused(config(path)), path, None, None, "parquet")


def test_byte_order_mark_on_first_line_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    assert plan_taskset(config(path), 4, 1, None).rows == 1


def test_non_finite_answer_is_refused(tmp_path):
    path = tmp_path / "nan.jsonl"
    path.write_text('{"prompt": "p", "answer": NaN}\n')
    assert_located(refused(config(path)), path, 1, "answer", "finite")


def test_resume_skips_committed_steps(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in qa_rows(10)))
    cfg = config(path)
    plan = plan_taskset(cfg, 4, 2, None)  # 20 tasks over 2 epochs, steps 1..5
    tables = [
        t
        for fi, ep in read_units(plan, first_step=4)
        for t in iter_task_tables(cfg, plan, fi, ep, first_step=4)
    ]
    steps = [s for t in tables for s in t.column("step").to_pylist()]
    assert steps == [4] * 4 + [5] * 4
    assert read_units(plan, first_step=4) == [(0, 1)]


def test_eval_tasks_carry_the_step_they_evaluate(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in qa_rows(5)))
    cfg = config(path)
    plan = plan_taskset(cfg, 5, 1, None)
    table = next(iter_task_tables(cfg, plan, 0, 0, is_eval=True, workflow="eval_math", step_label=7))
    assert table.column("step").to_pylist() == [7] * 5
    assert set(table.column("workflow").to_pylist()) == {"eval_math"}
    assert all(table.column("is_eval").to_pylist())


# --- on_bad_row: skip ---------------------------------------------------------------------------------------


def test_skip_leaves_bad_rows_out_counts_them_and_keeps_steps_full(write_jsonl, tmp_path):
    rows = qa_rows(6)
    lines = [
        json.dumps(rows[0]),
        "{not json",
        json.dumps(rows[1]),
        json.dumps({"prompt": "no answer"}),
        json.dumps(rows[2]),
        "[1, 2]",
        *(json.dumps(r) for r in rows[3:]),
    ]
    path = write_jsonl(lines)
    path.write_bytes(path.read_bytes() + b'{"prompt": "\xff", "answer": "1"}\n')  # not UTF-8
    cfg = config(path, on_bad_row="skip")
    plan = plan_for(cfg, batch_size=3)
    assert plan.rows == 6 and plan.skipped_rows == 4
    assert [(file, list(rows)) for file, rows in plan.skipped] == [(str(path), [2, 4, 6, 10])]
    assert "not valid JSON" in plan.skip_messages[0] and f"{path}:2" in plan.skip_messages[0]
    blocks = read_all(cfg, plan)
    assert column(blocks, "truth") == [r["answer"] for r in rows]
    assert column(blocks, "step") == [1, 1, 1, 2, 2, 2]
    assert column(blocks, "index") == list(range(6))  # positions skip nothing: steps stay full


def test_raise_is_the_default_and_names_the_first_bad_row(write_jsonl):
    path = write_jsonl([*qa_rows(2), "{not json"])
    assert_located(refused(config(path)), path, 3, None, "not valid JSON")


def test_skip_with_nothing_usable_is_refused_with_a_reason(write_jsonl):
    path = write_jsonl(["{", "{"])
    err = refused(config(path, on_bad_row="skip"))
    assert "no usable rows (2 bad ones skipped" in str(err)
