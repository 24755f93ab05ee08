"""Task / Experience / result rows: round trips through Arrow and the checks that guard a trainer."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
from unit_factories import make_experience, make_results

from schemas.errors import InputError
from schemas.experience import EXPERIENCE_SCHEMA, MalformedExperience, experiences_to_table, make_uid
from schemas.status import RESULT_SCHEMA, flatten_experiences, results_to_table
from schemas.task import TASK_SCHEMA, Task, make_task_uid, tasks_from_table, tasks_to_table


def make_task(**overrides) -> Task:
    fields = {
        "task_uid": make_task_uid("arith", 0, 7),
        "taskset": "arith",
        "epoch": 0,
        "index": 7,
        "step": 2,
        "truth": "42",
        "workflow": "math",
        "reward_fn": "math_accuracy",
        "prompt": "What is 6 * 7?",
    }
    fields.update(overrides)
    return Task(**fields)


# --- InputError -------------------------------------------------------------------------------------------


def test_input_error_names_file_row_and_field():
    err = InputError("missing", file="a.jsonl", row=3, field="answer")
    assert str(err) == "a.jsonl:3, field 'answer': missing"
    assert (err.file, err.row, err.field, err.reason) == ("a.jsonl", 3, "answer", "missing")
    assert isinstance(err, ValueError)
    assert str(InputError("plain")) == "plain"


# --- Task ---------------------------------------------------------------------------------------------------


def test_task_uid_is_stable_and_epoch_specific():
    assert make_task_uid("arith", 0, 7) == make_task_uid("arith", 0, 7)
    assert make_task_uid("arith", 0, 7) != make_task_uid("arith", 1, 7)


def test_task_round_trip_through_arrow_decodes_json_columns():
    tasks = [
        make_task(rollout_args={"temperature": 0.5, "max_tokens": 8}, workflow_args={"k": [1, 2]}),
        make_task(
            task_uid="arith/e0/8",
            index=8,
            prompt=None,
            messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
            repeat_times=3,
            reward_fn_args={"scale": 2},
            is_eval=True,
        ),
    ]
    table = tasks_to_table(tasks)
    assert table.schema.equals(TASK_SCHEMA)
    assert table.column("rollout_args")[0].as_py() == '{"max_tokens": 8, "temperature": 0.5}'
    back = tasks_from_table(table)
    assert back == tasks
    assert back[0].rollout_args == {"temperature": 0.5, "max_tokens": 8}
    assert back[1].messages[1] == {"role": "user", "content": "2+2?"}
    assert back[1].prompt is None and back[1].reward_fn_args == {"scale": 2}


def test_task_from_row_treats_null_json_as_empty():
    row = make_task().to_row()
    row["workflow_args"] = None
    assert Task.from_row(row).workflow_args == {}


@pytest.mark.parametrize(
    "overrides",
    [
        {"prompt": "p", "messages": [{"role": "user", "content": "m"}]},
        {"prompt": None, "messages": None},
    ],
    ids=["both", "neither"],
)
def test_task_needs_exactly_one_of_prompt_or_messages(overrides):
    with pytest.raises(InputError) as info:
        make_task(**overrides)
    assert info.value.field == "prompt"
    assert "exactly one of 'prompt' or 'messages'" in str(info.value)


@pytest.mark.parametrize("repeat_times", [0, -1])
def test_task_refuses_repeat_times_below_one(repeat_times):
    with pytest.raises(InputError) as info:
        make_task(repeat_times=repeat_times)
    assert info.value.field == "repeat_times"
    assert "'repeat_times'" in str(info.value) and str(repeat_times) in str(info.value)


# --- Experience ---------------------------------------------------------------------------------------------


def test_valid_experience_passes_validation_and_has_uid():
    exp = make_experience("t/e0/3", 2)
    exp.validate()
    assert exp.uid == make_uid("t/e0/3", 2) == "t/e0/3/2"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"response_ids": [], "logprobs": []}, "empty response_ids"),
        ({"logprobs": [-0.1, -0.2]}, "2 logprobs for 3 response tokens"),
        ({"action_mask": [True]}, "action_mask length"),
        ({"reward": math.nan}, "reward is nan"),
        ({"reward": math.inf}, "reward is inf"),
    ],
    ids=["empty-response", "logprobs-mismatch", "mask-mismatch", "nan-reward", "inf-reward"],
)
def test_malformed_experience_is_refused(overrides, fragment):
    with pytest.raises(MalformedExperience, match=fragment) as info:
        make_experience("t/e0/1", 0, **overrides).validate()
    assert "t/e0/1/0" in str(info.value)


def test_experiences_to_table_matches_schema_and_fills_defaults():
    table = experiences_to_table([make_experience(run_id=0), make_experience(run_id=1, metrics={"m": 1.0})])
    assert table.schema.equals(EXPERIENCE_SCHEMA)
    assert table.column("uid").to_pylist() == ["t/e0/0/0", "t/e0/0/1"]
    assert table.column("action_mask")[0].as_py() == [True, True, True]
    assert table.column("reward_parts")[0].as_py() == [("accuracy", 1.0)]
    assert table.column("metrics").to_pylist() == ["{}", '{"m": 1.0}']
    assert table.column("advantage").null_count == 2


def test_empty_experience_table_has_schema():
    table = experiences_to_table([])
    assert len(table) == 0 and table.schema.equals(EXPERIENCE_SCHEMA)


# --- result rows -> experiences -----------------------------------------------------------------------------


def test_results_flatten_back_to_experiences_skipping_failed_tasks():
    results = make_results([("a", 1, 2), ("b", 1, 0), ("c", 1, 1)])
    assert results.schema.equals(RESULT_SCHEMA)
    assert results.column("ok").to_pylist() == [True, False, True]
    flat = flatten_experiences(results)
    assert flat.schema.equals(EXPERIENCE_SCHEMA)
    assert flat.column("uid").to_pylist() == ["a/0", "a/1", "c/0"]
    expected = experiences_to_table([make_experience(u, r) for u, r in [("a", 0), ("a", 1), ("c", 0)]])
    assert flat.equals(expected)


def test_result_rows_name_their_sub_run_and_put_task_run_time_into_the_metric():
    results = make_results([("a", 1, 2, 4), ("b", 1, 0)])
    rows = results.to_pylist()
    assert [(r["run_id_base"], r["repeat_times"]) for r in rows] == [(4, 2), (0, 1)]
    assert [json.loads(r["metric"]) for r in rows] == [{"task_run_time": 0.25}] * 2
    assert flatten_experiences(results).column("run_id").to_pylist() == [4, 5]


def test_flatten_respects_slices_and_chunks():
    results = make_results([("a", 1, 2), ("b", 1, 0), ("c", 1, 1)])
    assert flatten_experiences(results.slice(1, 1)).num_rows == 0
    assert flatten_experiences(results.slice(2)).column("uid").to_pylist() == ["c/0"]
    assert flatten_experiences(pa.concat_tables([results, results])).num_rows == 6


@pytest.mark.parametrize("spec", [[("a", 1, 0), ("b", 1, 0)], []], ids=["all-failed", "no-rows"])
def test_flatten_of_tables_without_experiences_is_empty_with_schema(spec):
    flat = flatten_experiences(make_results(spec) if spec else results_to_table([]))
    assert flat.num_rows == 0
    assert flat.schema.equals(EXPERIENCE_SCHEMA)
