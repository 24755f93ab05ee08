"""SQL sink on SQLite: a step commits once, whole, in one transaction, and reads back exactly as written."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from sink_doubles import CrashBeforeCleanupDouble, HalfInsertDouble
from unit_factories import fragments_of, make_experience, make_result, make_results, write_and_commit

from operators.sinks.base import default_table_name, open_sink
from operators.sinks.parquet import PENDING, ParquetSink, step_dirname, write_fragments
from operators.sinks.sql import SqlSink
from schemas.config import ExperienceBufferConfig
from schemas.errors import InputError
from schemas.experience import EXPERIENCE_SCHEMA, experiences_to_table
from schemas.status import results_to_table


@pytest.fixture
def root(tmp_path):
    return tmp_path / "experiences"


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'experiences.db'}"


@pytest.fixture
def sink(root, url):
    return SqlSink(root, url, "run")


def pending_dir(root, step: int):
    return root / PENDING / step_dirname(step)


def row_count(sink: SqlSink) -> int:
    with sink.engine.connect() as conn:
        return conn.scalar(sa.select(sa.func.count()).select_from(sink.experiences))


def test_a_step_reads_back_exactly_as_committed(sink, root):
    tricky = [
        make_experience("t/e0/0", 0, logprobs=[-0.1, -1e-30, -3.4e38], reward=0.3, advantage=-0.7),
        make_experience(
            "t/e0/0",
            1,
            prompt_text="Ünïcode ✓ 'quotes' \"and\" \\ back",
            reward_parts={"accuracy": 0.1, "format": 1 / 3},
            action_mask=[True, False, True],
            metrics={"k": 1.5},
            info={"nested": [1, {"a": None}]},
        ),
        make_experience("t/e0/1", 0, reward_parts={}, n_tokens=1),
    ]
    table = experiences_to_table(tricky)
    pending_dir(root, 1).mkdir(parents=True)
    pq.write_table(table, pending_dir(root, 1) / "part-a.parquet")
    assert sink.commit_step(1, {"part-a.parquet"}) == 0
    back = sink.read_step(1)
    assert back.schema.equals(EXPERIENCE_SCHEMA)
    assert back.equals(table)  # float32 values, nulls, maps, lists, text: bit for bit
    assert back.column("logprobs").to_pylist() == table.column("logprobs").to_pylist()


def test_a_step_reads_as_from_the_parquet_sink(sink, root, tmp_path):
    results = make_results([("a", 1, 2), ("b", 1, 3), ("c", 1, 1)])
    parquet = ParquetSink(tmp_path / "parquet")
    parquet.commit_step(1, fragments_of(write_fragments(results, str(parquet.root))))
    sink.commit_step(1, fragments_of(write_fragments(results, str(root))))
    assert sink.read_step(1).equals(parquet.read_step(1))


def test_leftovers_are_ignored_and_the_pending_folder_removed(sink, root):
    results = make_results([("a", 1, 2), ("b", 1, 1)])
    records = write_fragments(results, str(root))
    write_fragments(results, str(root))  # a retried writer leaves a second copy behind
    (pending_dir(root, 1) / "part-x.partial").write_bytes(b"half written")
    assert sink.commit_step(1, fragments_of(records)) == 0
    assert sink.read_step(1).column("uid").to_pylist() == ["a/0", "a/1", "b/0"]
    assert row_count(sink) == 3
    assert not pending_dir(root, 1).exists()


def test_a_step_commits_once(sink):
    write_and_commit(sink, [("a", 1, 2)])
    with pytest.raises(RuntimeError, match="step 1 is already committed in sqlite:///.*, table run"):
        sink.commit_step(1, set())
    assert sink.committed_steps() == [1] and row_count(sink) == 2


def test_an_experience_already_in_the_table_fails_its_whole_step(sink, root):
    write_and_commit(sink, [("a", 1, 2)])
    records = write_fragments(make_results([("b", 2, 1), ("a", 2, 1)]), str(root))  # a/0 again
    taken = r"step 2 not committed: .* already holds .*\(task_uid, run_id, segment\)"
    with pytest.raises(RuntimeError, match=taken):
        sink.commit_step(2, fragments_of(records))
    assert sink.committed_steps() == [1] and row_count(sink) == 2  # not even b/0
    assert pending_dir(root, 2).exists()  # kept: nothing of it was committed


def test_a_missing_fragment_commits_nothing(sink, root):
    write_fragments(make_results([("a", 1, 1)]), str(root))
    with pytest.raises(RuntimeError, match="fragments reported but not on disk"):
        sink.commit_step(1, {"part-gone.parquet"})
    assert sink.committed_steps() == []


def test_stale_experiences_are_dropped_and_counted(sink, root):
    rows = [make_result("old", 1, 2, model_version=1), make_result("new", 1, 3, model_version=3)]
    records = write_fragments(results_to_table(rows), str(root))
    assert sink.commit_step(1, fragments_of(records), min_version=2) == 2
    assert sink.read_step(1).column("task_uid").to_pylist() == ["new"] * 3


def test_a_step_where_every_task_failed_commits_empty(sink):
    write_and_commit(sink, [("a", 1, 0), ("b", 2, 1)])
    assert sink.committed_steps() == [1, 2]
    empty = sink.read_step(1)
    assert empty.num_rows == 0 and empty.schema.equals(EXPERIENCE_SCHEMA)


def test_an_insert_that_fails_halfway_leaves_nothing(root, url):
    records = write_fragments(make_results([("a", 1, 2), ("b", 1, 2)]), str(root))
    with pytest.raises(RuntimeError, match="double: died halfway"):
        HalfInsertDouble(root, url, "run").commit_step(1, fragments_of(records))
    fresh = SqlSink(root, url, "run")
    assert fresh.committed_steps() == [] and row_count(fresh) == 0
    assert fresh.commit_step(1, fragments_of(records)) == 0  # the fragments are still there to retry
    assert fresh.read_step(1).num_rows == 4


def test_a_crash_after_the_commit_leaves_a_committed_step(root, url):
    records = write_fragments(make_results([("a", 1, 2)]), str(root))
    with pytest.raises(RuntimeError, match="double: died after the commit"):
        CrashBeforeCleanupDouble(root, url, "run").commit_step(1, fragments_of(records))
    resumed = SqlSink(root, url, "run")
    assert pending_dir(root, 1).exists()
    assert resumed.committed_steps() == [1] and resumed.read_step(1).num_rows == 2
    with pytest.raises(RuntimeError, match="already committed"):
        resumed.commit_step(1, fragments_of(records))
    resumed.discard_pending()
    assert not (root / PENDING).exists() and row_count(resumed) == 2


def test_runs_share_a_database_one_table_pair_each(root, url):
    first, second = SqlSink(root, url, "first"), SqlSink(root, url, "second")
    write_and_commit(first, [("a", 1, 2)])
    write_and_commit(second, [("a", 1, 1), ("b", 2, 1)])  # the same keys, another run
    assert first.committed_steps() == [1] and second.committed_steps() == [1, 2]
    assert sa.inspect(first.engine).get_table_names() == ["first", "first_steps", "second", "second_steps"]


def test_a_reader_sees_no_steps_before_the_tables_exist(sink):
    assert sink.committed_steps() == []
    assert sink.read_step(1).num_rows == 0
    assert not sa.inspect(sink.engine).get_table_names()  # reading creates nothing


def test_discard_pending_also_removes_the_empty_staging_root(sink, root):
    write_fragments(make_results([("a", 1, 1)]), str(root))
    sink.discard_pending()
    assert not root.exists()


def test_a_table_of_another_schema_is_refused(sink, url):
    with sa.create_engine(url).begin() as conn:
        conn.execute(sa.text("CREATE TABLE run (id INTEGER PRIMARY KEY, payload TEXT)"))
    with pytest.raises(InputError) as info:
        sink.committed_steps()
    message = str(info.value)
    assert "field 'buffer.trainer_input.experience_buffer.name'" in message
    assert "table run in sqlite:///" in message and "not an rftflow experience table" in message
    assert "'payload'" in message and "choose another name" in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("not a url", "not a SQLAlchemy URL: not a url"),
        ("sqlite://", "an in-memory SQLite database loses the experiences at exit"),
        ("sqlite:///:memory:", "an in-memory SQLite database loses the experiences at exit"),
        ("nosuchdb+driver://u:secret@h/db", "nosuchdb+driver://u:***@h/db: no database driver"),
    ],
)
def test_bad_urls_are_refused_with_the_password_masked(root, url, expected):
    with pytest.raises(InputError, match="field 'buffer.trainer_input.experience_buffer.path'") as info:
        SqlSink(root, url, "run")
    assert expected in str(info.value) and "secret" not in str(info.value)


def test_an_unreachable_server_names_the_url_without_its_password(root):
    sink = SqlSink(root, "postgresql+psycopg://rft:secret@127.0.0.1:1/db?connect_timeout=5", "run")
    with pytest.raises(InputError) as info:
        sink.committed_steps()
    message = str(info.value)
    assert "cannot use postgresql+psycopg://rft:***@127.0.0.1:1/db" in message and "secret" not in message
    assert "check the URL and the server" in message and "\n" not in message


def test_a_relative_sqlite_path_is_made_absolute(root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sink = SqlSink(root, "sqlite:///rel/exp.db", "run")
    assert sink.url.database == str(tmp_path / "rel" / "exp.db")
    write_and_commit(sink, [("a", 1, 1)])
    assert (tmp_path / "rel" / "exp.db").is_file()


def test_open_sink_defaults(tmp_path):
    run_dir = tmp_path / "explore-20261202-130000"
    parquet = open_sink(ExperienceBufferConfig(), run_dir)
    assert isinstance(parquet, ParquetSink) and parquet.root == run_dir / "experiences"
    sql = open_sink(ExperienceBufferConfig(storage_type="sql"), run_dir)
    assert isinstance(sql, SqlSink) and sql.root == run_dir / "experiences"
    assert sql.url.database == str(run_dir / "experiences.db") and sql.name == "explore_20261202_130000"
    assert (
        sql.describe()
        == f"sqlite:///{run_dir}/experiences.db, table {sql.name} (SQL, commit log {sql.name}_steps)"
    )
    named = open_sink(
        ExperienceBufferConfig(storage_type="sql", path="sqlite:////x/y.db", name="mine"), run_dir
    )
    assert named.url.database == "/x/y.db" and named.name == "mine"


def test_default_table_names_are_plain_identifiers():
    assert default_table_name("explore-2026.12") == "explore_2026_12"
    assert default_table_name("2026-run") == "run_2026_run"
    long = default_table_name("x" * 100)
    assert len(long) == 48 and long != default_table_name("x" * 99)
