"""Fuzzing the checks made before any engine starts: whatever the input, the answer is a run that may start
(exit 0) or a located refusal (exit 2), never a traceback.

In process, derandomized, at most 200 examples per property: jsonl rows, Parquet column types, config trees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from operators.rollout.plugins import PluginError
from pipelines.control.checks import check_inputs
from schemas.config import load_config
from schemas.errors import InputError

FUZZ = settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
ROW = st.one_of(
    st.fixed_dictionaries({"prompt": JSON, "answer": JSON}),
    st.dictionaries(st.sampled_from(["prompt", "answer", "messages", "x"]), JSON, max_size=3),
    JSON,
)


def exit_code(config_file: Path | None, overrides: list[str]) -> int:
    """What the CLI would answer before starting an engine: 0 (may start) or 2 (refused, located)."""
    try:
        check_inputs(load_config(config_file, overrides))
    except (InputError, PluginError):
        return 2
    return 0


@FUZZ
@given(rows=st.lists(ROW, max_size=6), raw=st.lists(st.binary(max_size=30), max_size=2))
def test_any_jsonl_is_checked_or_refused(tmp_path_factory, rows: list[Any], raw: list[bytes]):
    path = tmp_path_factory.mktemp("jsonl") / "t.jsonl"
    lines = [json.dumps(r, allow_nan=True).encode() for r in rows] + raw
    path.write_bytes(b"\n".join(lines))
    assert exit_code(None, [f"buffer.explorer_input.taskset.path={path}", "buffer.batch_size=2"]) in (0, 2)


COLUMN = st.one_of(
    st.lists(st.text(max_size=10) | st.none(), min_size=1, max_size=4).map(pa.array),
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.none(), min_size=1, max_size=4).map(pa.array),
    st.lists(st.floats() | st.none(), min_size=1, max_size=4).map(pa.array),
    st.lists(st.lists(st.integers(0, 9), max_size=3), min_size=1, max_size=4).map(pa.array),
    st.lists(st.booleans(), min_size=1, max_size=4).map(pa.array),
)


@FUZZ
@given(columns=st.dictionaries(st.sampled_from(["prompt", "answer", "other"]), COLUMN, max_size=3))
def test_any_parquet_columns_are_checked_or_refused(tmp_path_factory, columns: dict[str, pa.Array]):
    length = min((len(c) for c in columns.values()), default=1)
    table = pa.table({k: v.slice(0, length) for k, v in columns.items()} or {"x": pa.array([1])})
    path = tmp_path_factory.mktemp("parquet") / "t.parquet"
    pq.write_table(table, path)
    assert exit_code(None, [f"buffer.explorer_input.taskset.path={path}"]) in (0, 2)


KEYS = st.sampled_from(
    ["buffer", "batch_size", "explorer", "rollout_model", "taskset", "explorer_input", "max_tokens",
     "temperature", "repeat_times", "model", "model_path", "synchronizer", "sync_method", "monitor", "x"]
)  # fmt: skip
TREE = st.recursive(JSON, lambda children: st.dictionaries(KEYS, children, max_size=4), max_leaves=16)


@FUZZ
@given(tree=TREE)
def test_any_config_tree_is_checked_or_refused(tmp_path_factory, tree: Any):
    path = tmp_path_factory.mktemp("config") / "c.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert exit_code(path, []) in (0, 2)
