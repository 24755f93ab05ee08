"""A taskset row's `info`: read from jsonl and Parquet (object, struct or JSON-text column), refused with its
file, row and field when it is not a JSON object or is too big, given to reward functions that declare an
`info` parameter, and written to each experience as `info.task` beside the keys ops add. No Ray, no vLLM.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from unit_factories import ScriptedEngine

from operators.engine.client import EngineClient
from operators.ops.pass_rate import PassRate
from operators.rollout import reward_registry
from operators.rollout.runner import SubRun, WorkflowRunner
from operators.tasks.info import MAX_INFO_BYTES
from operators.tasks.reader import iter_task_tables, plan_taskset, read_units
from schemas.config import FormatConfig, TasksetConfig
from schemas.errors import InputError
from schemas.experience import experiences_to_table
from schemas.experience_ops import PassRateArgs
from schemas.task import Task, tasks_from_table

ROWS = [
    {"prompt": "1+1?", "answer": "2", "info": {"family": "sum", "terms": [1, 1]}},
    {"prompt": "2+2?", "answer": "4"},  # no info: an empty one
]


def read_tasks(cfg: TasksetConfig) -> list[Task]:
    plan = plan_taskset(cfg, 2, 1, None)
    tables = [t for unit in read_units(plan) for t in iter_task_tables(cfg, plan, *unit)]
    return tasks_from_table(pa.concat_tables(tables))


def write_parquet(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


def test_jsonl_info_objects_reach_the_tasks_and_a_missing_one_is_empty(write_jsonl):
    tasks = read_tasks(TasksetConfig(path=write_jsonl(ROWS)))
    assert [t.info for t in tasks] == [{"family": "sum", "terms": [1, 1]}, {}]


def test_parquet_struct_and_json_text_columns_are_read_alike(tmp_path):
    struct = pa.Table.from_pylist([{**r, "info": r.get("info")} for r in ROWS])
    assert pa.types.is_struct(struct.schema.field("info").type)
    text = struct.set_column(2, "info", pa.array([json.dumps(ROWS[0]["info"]), None]))
    for name, table in (("struct", struct), ("text", text)):
        tasks = read_tasks(TasksetConfig(path=write_parquet(tmp_path / f"{name}.parquet", table)))
        assert [t.info for t in tasks] == [{"family": "sum", "terms": [1, 1]}, {}], name


def test_info_key_can_be_renamed_or_turned_off(write_jsonl):
    path = write_jsonl([{"prompt": "q", "answer": "a", "meta": {"k": 1}, "info": "ignored"}])
    renamed = TasksetConfig(path=path, format=FormatConfig(info_key="meta"))
    assert read_tasks(renamed)[0].info == {"k": 1}
    off = TasksetConfig(path=path, format=FormatConfig(info_key=None))
    assert read_tasks(off)[0].info == {}


@pytest.mark.parametrize(
    ("info", "fragment"),
    [
        ("a string", "expected a JSON object, got string"),
        ([1, 2], "expected a JSON object, got array"),
        (3, "expected a JSON object, got number"),
        ({"blob": "x" * MAX_INFO_BYTES}, f"more than the {MAX_INFO_BYTES}"),
    ],
)
def test_jsonl_info_that_is_no_object_or_too_big_is_refused_with_file_row_and_field(
    write_jsonl, info, fragment
):
    path = write_jsonl([ROWS[1], {"prompt": "q", "answer": "a", "info": info}])
    with pytest.raises(InputError, match=fragment) as caught:
        plan_taskset(TasksetConfig(path=path), 2, 1, None)
    assert (caught.value.file, caught.value.row, caught.value.field) == (str(path), 2, "info")


@pytest.mark.parametrize(
    ("column", "fragment"),
    [
        (pa.array(["not json"]), "JSON object's text"),
        (pa.array(["[1]"]), "got array"),
        (pa.array([[1, 2]]), "got array"),
        (pa.array([{"raw": b"\x00"}]), "not JSON-representable"),
    ],
)
def test_parquet_info_that_is_no_json_object_is_refused_with_file_row_and_field(tmp_path, column, fragment):
    table = pa.table({"prompt": ["q"], "answer": ["a"], "info": column})
    path = write_parquet(tmp_path / "t.parquet", table)
    with pytest.raises(InputError, match=fragment) as caught:
        plan_taskset(TasksetConfig(path=path), 2, 1, None)
    assert (caught.value.file, caught.value.row, caught.value.field) == (str(path), 1, "info")


@pytest.fixture
def scratch_rewards(monkeypatch):
    """A copy of the reward registry (built-ins loaded), so test registrations do not leak."""
    reward_registry.get_reward_fn("math_accuracy")
    monkeypatch.setattr(reward_registry, "REWARD_FNS", dict(reward_registry.REWARD_FNS))


def run_tasks(tasks: list[Task], texts: list[str]) -> list:
    runner = WorkflowRunner(max_timeout=30, max_retry_times=0)
    engine = EngineClient(ScriptedEngine(texts))
    return [e for t in tasks for e in asyncio.run(runner.attempt(SubRun(t, 0, t.repeat_times), engine))]


def test_info_reaches_a_reward_function_that_takes_it_and_lands_in_the_experience(
    write_jsonl, scratch_rewards
):
    @reward_registry.register_reward("terms_reward")
    def terms_reward(response: str, truth: str, info: dict, scale: float = 1.0) -> dict[str, float]:
        return {"reward": scale * len(info.get("terms", [])) / 4}

    cfg = TasksetConfig(path=write_jsonl(ROWS), default_reward_fn_type="terms_reward", repeat_times=2)
    cfg = cfg.model_copy(update={"reward_fn_args": {"scale": 2.0}})
    experiences = run_tasks(read_tasks(cfg), ["2"])
    assert [e.reward for e in experiences] == [1.0, 1.0, 0.0, 0.0]
    assert [e.info for e in experiences] == [{"task": ROWS[0]["info"]}] * 2 + [{}] * 2

    table = PassRate(PassRateArgs(threshold=0.5))(experiences_to_table(experiences))
    infos = [json.loads(text) for text in table.column("info").to_pylist()]
    assert infos[0] == {"task": ROWS[0]["info"], "pass_rate": 1.0, "pass_rate_runs": 2}
    assert infos[2] == {"pass_rate": 0.0, "pass_rate_runs": 2}


def test_two_argument_reward_functions_keep_working_beside_info(write_jsonl):
    cfg = TasksetConfig(path=write_jsonl(ROWS), repeat_times=1)  # math_accuracy(response, truth)
    experiences = run_tasks(read_tasks(cfg), ["<answer>2</answer>"])
    assert [e.reward for e in experiences] == [1.0, 0.0]
    assert experiences[0].info == {"task": ROWS[0]["info"]}
