"""Run data on an object store, against a real S3-compatible server (moto, started by the `s3_server`
fixture): the marker commit, what readers and resume honour, the state and config on the store, and the
local-disk defaults refused for a remote run dir."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from unit_factories import fragments_of, make_results

from operators.sinks.base import open_sink
from operators.sinks.object_store import MarkedParquetSink
from operators.sinks.parquet import write_fragments
from operators.sinks.reader import ExperienceReader, open_reader
from pipelines.control.checks import check_local_defaults, check_run_dir
from pipelines.control.resume_check import check_resume
from pipelines.control.state import ExplorerState, resume_state
from schemas.atomic import COMMIT_MARKER, atomic_open, atomic_write_json, atomic_write_text, committed_files
from schemas.config import load_config
from schemas.errors import InputError
from schemas.run_dir import CONFIG, EXPLORER_STATE
from schemas.storage import as_location, base_name, display, filesystem, is_file, is_remote, join

pytestmark = pytest.mark.timeout(60)


class SimulatedCrash(Exception):
    """Test double for a process killed between a step's fragments and its marker."""


@pytest.fixture
def run_dir(s3_server, request) -> str:
    return s3_server.uri(s3_server.new_bucket(), f"runs/{request.node.name[:40]}")


def objects(location: str) -> list[str]:
    """Every object under `location`, relative to it."""
    fs, path = filesystem(location)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(i.path.removeprefix(path + "/") for i in infos if i.type == pafs.FileType.File)


def write_step(sink: MarkedParquetSink, step: int, uids: str, retried: bool = False) -> set[str]:
    """Fragments of `step`'s tasks written as a writer stage would (twice when `retried`); their names."""
    results = make_results([(uid, step, 2) for uid in uids])
    records = write_fragments(results, sink.root)
    if retried:  # a retried batch writes a second copy that no record names
        write_fragments(results, sink.root)
    return fragments_of(records, step)


def test_uris_keep_their_slashes_and_query_and_hide_credentials():
    uri = "s3://key:secret@bucket/runs/a?endpoint_override=h:1&scheme=http"
    assert is_remote(uri) and not is_remote("runs/a") and not is_remote("file:///tmp/a")
    assert as_location(uri) == uri
    assert join(uri, "experiences", "step_000001") == (
        "s3://key:secret@bucket/runs/a/experiences/step_000001?endpoint_override=h:1&scheme=http"
    )
    assert base_name(uri) == "a" and base_name("gs://bucket") == "bucket"
    assert "secret" not in display(uri) and display(uri).startswith("s3://***@bucket/runs/a")


def test_a_step_is_committed_by_its_marker_with_exactly_the_named_fragments(run_dir):
    sink = open_sink(load_config(None).buffer.trainer_input.experience_buffer, run_dir)
    assert isinstance(sink, MarkedParquetSink)
    fragments = write_step(sink, 1, "abc", retried=True)
    assert sink.committed_steps() == []
    sink.commit_step(1, fragments)
    assert sink.committed_steps() == [1]
    step_dir = join(sink.root, "step_000001")
    assert committed_files(step_dir) == sorted(fragments)
    assert sorted(objects(step_dir)) == sorted([*fragments, COMMIT_MARKER])  # not the retried copy
    assert objects(join(sink.root, "_pending")) == []
    table = sink.read_step(1)
    assert table.num_rows == 6 and len(set(table.column("uid").to_pylist())) == 6
    with pytest.raises(RuntimeError, match="already committed"):
        sink.commit_step(1, fragments)
    empty = write_step(sink, 2, "")
    sink.commit_step(2, empty)  # a step whose tasks all failed commits empty
    assert sink.committed_steps() == [1, 2] and sink.read_step(2).num_rows == 0


def test_a_crash_between_fragments_and_marker_is_invisible_then_redone_once(run_dir, monkeypatch):
    buffer = load_config(None).buffer.trainer_input.experience_buffer
    sink = open_sink(buffer, run_dir)
    sink.commit_step(1, write_step(sink, 1, "ab"))
    ExplorerState(latest_step=1, mlflow_run_id="run-1").save(run_dir)

    def crash(folder, names):
        raise SimulatedCrash(folder)

    monkeypatch.setattr("operators.sinks.object_store.write_commit_marker", crash)
    first_try = write_step(sink, 2, "cd")
    with pytest.raises(SimulatedCrash):
        sink.commit_step(2, first_try)
    monkeypatch.undo()
    assert sorted(objects(join(sink.root, "step_000002"))) == sorted(first_try)  # copied, never published

    # every reader sees step 1 only: the sink, the trainer's reader, and resume
    resumed = open_sink(buffer, run_dir)
    assert resumed.committed_steps() == [1]
    reader = ExperienceReader(resumed)
    assert [step for step, _ in reader.steps()] == [1]
    with pytest.raises(KeyError):
        reader.read_step(2)
    assert resume_state(run_dir, resumed).latest_step == 1

    # the resumed run drops the unpublished copies and redoes the step: its rows once, never twice
    resumed.discard_pending()
    assert objects(join(resumed.root, "step_000002")) == []
    second_try = write_step(resumed, 2, "cd")
    resumed.commit_step(2, second_try)
    assert resumed.committed_steps() == [1, 2]
    table = resumed.read_step(2)
    assert table.num_rows == 4 and sorted(set(table.column("task_uid").to_pylist())) == ["c", "d"]
    assert committed_files(join(resumed.root, "step_000002")) == sorted(second_try)


def test_stale_experiences_are_dropped_before_the_copy(run_dir):
    sink = open_sink(load_config(None).buffer.trainer_input.experience_buffer, run_dir)
    fragments = write_step(sink, 1, "ab")
    versions = set(sink_table_versions(sink, fragments))
    dropped = sink.commit_step(1, fragments, min_version=max(versions) + 1)
    assert dropped == 4 and sink.read_step(1).num_rows == 0


def sink_table_versions(sink: MarkedParquetSink, fragments: set[str]) -> list[int]:
    fs, path = filesystem(join(sink.root, "_pending", "step_000001"))
    tables = [pq.read_table(f"{path}/{name}", filesystem=fs) for name in fragments]
    return pa.concat_tables(tables).column("model_version").to_pylist()


def test_state_config_and_the_trainer_reader_live_on_the_store(run_dir, tmp_path):
    cfg = load_config(None, ["buffer.batch_size=2"])
    ExplorerState(latest_step=0, mlflow_run_id="abc", model_version=3).save(run_dir)
    assert ExplorerState.load(run_dir).model_version == 3
    assert json.loads(pafs_read(join(run_dir, EXPLORER_STATE)))["mlflow_run_id"] == "abc"
    atomic_write_text(join(run_dir, CONFIG), (tmp_path / "none").as_posix() and dump(cfg))
    check_resume(cfg, run_dir)  # the same config: allowed
    with pytest.raises(InputError, match="buffer.batch_size"):
        check_resume(load_config(None, ["buffer.batch_size=3"]), run_dir)
    sink = open_sink(cfg.buffer.trainer_input.experience_buffer, run_dir)
    sink.commit_step(1, write_step(sink, 1, "ab"))
    reader = open_reader(run_dir)  # its store from the config.yaml on the store
    assert [(step, t.num_rows) for step, t in reader.steps()] == [(1, 4)]


def dump(cfg) -> str:
    import yaml  # only here: the config as the explorer writes it

    return yaml.safe_dump(cfg.public_dump(), sort_keys=False)


def pafs_read(location: str) -> bytes:
    fs, path = filesystem(location)
    with fs.open_input_stream(path) as f:
        return f.read()


def test_an_object_store_write_publishes_whole_or_not_at_all(run_dir):
    target = join(run_dir, "file.json")
    with pytest.raises(SimulatedCrash), atomic_open(target) as f:
        f.write(b"half")
        raise SimulatedCrash("mid-write")
    assert not is_file(target)
    atomic_write_json(target, {"a": 1})
    assert json.loads(pafs_read(target)) == {"a": 1}


def test_a_remote_run_dir_refuses_local_disk_defaults_naming_each_key(run_dir):
    cfg = load_config(None)
    with pytest.raises(InputError, match="monitor.mlflow_uri"):
        check_local_defaults(cfg, run_dir, None)
    check_local_defaults(cfg, run_dir, "http://127.0.0.1:5000")
    checkpoint = load_config(None, ["synchronizer.sync_method=checkpoint"])
    with pytest.raises(InputError, match="synchronizer.checkpoint_dir"):
        check_local_defaults(checkpoint, run_dir, "http://127.0.0.1:5000")
    explicit = load_config(None, ["synchronizer.sync_method=checkpoint", "synchronizer.checkpoint_dir=/ck"])
    check_local_defaults(explicit, run_dir, "http://127.0.0.1:5000")
    sql = load_config(None, ["buffer.trainer_input.experience_buffer.storage_type=sql"])
    with pytest.raises(InputError, match="buffer.trainer_input.experience_buffer.path"):
        open_sink(sql.buffer.trainer_input.experience_buffer, run_dir)
    check_local_defaults(cfg, "runs/local", None)  # a local run dir keeps its defaults


def test_a_run_dir_that_is_an_object_or_an_unknown_bucket_is_refused(s3_server, run_dir):
    atomic_write_text(run_dir, "not a folder")
    with pytest.raises(InputError, match="is an object"):
        check_run_dir(run_dir)
    missing = s3_server.uri("no-such-bucket-rftflow", "runs/x")
    with pytest.raises(InputError, match="bucket does not exist"):
        check_run_dir(missing)
