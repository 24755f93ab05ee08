"""Parquet sink: writers leave pending fragments, the driver commits exactly the reported ones per step."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from unit_factories import fragments_of, make_result, make_results, write_and_commit

from operators.sinks.parquet import PENDING, RECORD_SCHEMA, ParquetSink, step_dirname, write_fragments
from schemas.experience import EXPERIENCE_SCHEMA
from schemas.status import flatten_experiences, results_to_table


@pytest.fixture
def root(tmp_path):
    return tmp_path / "experiences"


def pending_dir(root, step: int):
    return root / PENDING / step_dirname(step)


def test_step_dirname():
    assert step_dirname(3) == "step_000003"


def test_write_fragments_writes_one_fragment_per_step_and_a_record_per_task(root):
    records = write_fragments(make_results([("a", 1, 2), ("b", 1, 0), ("c", 2, 3)]), str(root))
    assert records.schema.equals(RECORD_SCHEMA)
    rows = records.to_pylist()
    assert [(r["task_uid"], r["step"], r["num_experiences"], r["ok"]) for r in rows] == [
        ("a", 1, 2, True),
        ("b", 1, 0, False),
        ("c", 2, 3, True),
    ]
    assert rows[1]["fragment"] is None and rows[1]["message"] == "boom"
    for step, expected in [(1, ["a/0", "a/1"]), (2, ["c/0", "c/1", "c/2"])]:
        files = sorted(p.name for p in pending_dir(root, step).iterdir())
        assert files == sorted(fragments_of(records, step)) and len(files) == 1
        table = pq.read_table(pending_dir(root, step) / files[0])
        assert table.schema.equals(EXPERIENCE_SCHEMA)
        assert table.column("uid").to_pylist() == expected
    assert not list(root.glob("step_*"))  # nothing is visible before a commit


def test_write_fragments_keeps_each_sub_run_as_its_own_record(root):
    records = write_fragments(make_results([("a", 1, 2, 0), ("a", 1, 2, 2), ("a", 1, 0, 4)]), str(root))
    rows = [
        (r["task_uid"], r["run_id_base"], r["repeat_times"], r["num_experiences"])
        for r in records.to_pylist()
    ]
    assert rows == [("a", 0, 2, 2), ("a", 2, 2, 2), ("a", 4, 1, 0)]
    (fragment,) = fragments_of(records)
    assert pq.read_table(pending_dir(root, 1) / fragment).column("run_id").to_pylist() == [0, 1, 2, 3]


def test_write_fragments_of_failed_tasks_writes_nothing(root):
    records = write_fragments(make_results([("a", 1, 0), ("b", 1, 0)]), str(root))
    assert records.column("num_experiences").to_pylist() == [0, 0]
    assert records.column("fragment").null_count == 2
    assert not root.exists()


def test_commit_publishes_only_the_named_fragments(root):
    results = make_results([("a", 1, 2), ("b", 1, 1)])
    records = write_fragments(results, str(root))
    write_fragments(results, str(root))  # a retried writer leaves a second copy behind
    (pending_dir(root, 1) / "part-x.partial").write_bytes(b"half written")
    assert len(list(pending_dir(root, 1).iterdir())) == 3
    sink = ParquetSink(root)
    assert sink.commit_step(1, fragments_of(records)) == 0
    final = root / "step_000001"
    assert {p.name for p in final.iterdir()} == fragments_of(records)
    assert not pending_dir(root, 1).exists()
    assert sink.committed_steps() == [1]
    assert sink.read_step(1).column("uid").to_pylist() == ["a/0", "a/1", "b/0"]  # no duplicates
    assert sink.read_step(1).equals(flatten_experiences(results))


def test_commit_of_a_missing_fragment_raises(root):
    write_fragments(make_results([("a", 1, 1)]), str(root))
    with pytest.raises(
        RuntimeError, match=r"step 1: fragments reported but not on disk: \['part-gone.parquet'\]"
    ):
        ParquetSink(root).commit_step(1, {"part-gone.parquet"})
    assert ParquetSink(root).committed_steps() == []


def test_committing_a_step_twice_raises(root):
    sink = ParquetSink(root)
    write_and_commit(sink, [("a", 1, 1)])
    with pytest.raises(RuntimeError, match="already committed"):
        sink.commit_step(1, set())
    assert sink.read_step(1).num_rows == 1  # the committed step is untouched


def test_readers_see_committed_steps_only(root):
    sink = ParquetSink(root)
    write_and_commit(sink, [("a", 1, 2), ("b", 2, 1)])
    write_fragments(make_results([("c", 3, 4)]), str(root))  # step 3 is still pending
    assert sink.committed_steps() == [1, 2]
    table = pq.read_table(root)
    assert sorted(table.column("uid").to_pylist()) == ["a/0", "a/1", "b/0"]
    sink.discard_pending()
    assert not (root / PENDING).exists()
    assert pq.read_table(root).num_rows == 3 and sink.committed_steps() == [1, 2]


def test_a_step_where_every_task_failed_commits_empty(root):
    sink = ParquetSink(root)
    records = write_and_commit(sink, [("a", 1, 0), ("b", 1, 0), ("c", 2, 1)])
    assert fragments_of(records, 1) == set()
    assert sink.committed_steps() == [1, 2]
    empty = sink.read_step(1)
    assert empty.num_rows == 0 and empty.schema.equals(EXPERIENCE_SCHEMA)
    assert pq.read_table(root).column("uid").to_pylist() == ["c/0"]


def test_sink_without_a_directory_has_no_steps(tmp_path):
    sink = ParquetSink(tmp_path / "absent")
    assert sink.committed_steps() == []
    sink.discard_pending()  # nothing to discard is fine


def test_commit_drops_experiences_below_the_staleness_bound(root):
    rows = [make_result("old", 1, 2, model_version=1), make_result("new", 1, 3, model_version=3)]
    records = write_fragments(results_to_table(rows), str(root))
    sink = ParquetSink(root)
    assert sink.commit_step(1, fragments_of(records), min_version=2) == 2
    kept = sink.read_step(1)
    assert kept.column("model_version").to_pylist() == [3, 3, 3]
    assert kept.column("task_uid").to_pylist() == ["new"] * 3
