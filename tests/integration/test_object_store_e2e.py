"""A real explore whose run dir is on an S3-compatible server (moto, the `s3_server` fixture): the committed
experiences are read back through the trainer's reader, and a resume after a crash between a step's
fragments and its marker redoes that step once."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest
from integration_settings import BASE
from unit.unit_factories import make_results

from operators.sinks.parquet import write_fragments
from operators.sinks.reader import open_reader
from pipelines.control.state import ExplorerState
from pipelines.explore import explore
from schemas.atomic import COMMIT_MARKER
from schemas.config import load_config
from schemas.run_dir import CONFIG, EXPLORER_STATE
from schemas.storage import filesystem, is_file, join

BATCH, REPEAT = 4, 2  # as BASE


def keys(table) -> list[tuple[str, int]]:
    return sorted(zip(table.column("task_uid").to_pylist(), table.column("run_id").to_pylist(), strict=True))


@pytest.mark.timeout(300)
def test_explore_on_s3_commits_by_marker_and_resumes_after_a_crash(s3_server, engines, tmp_path):
    run_dir = s3_server.uri(s3_server.new_bucket(), "runs/on-s3")
    mlflow = f"sqlite:///{tmp_path / 'mlflow.db'}"  # given explicitly: the default would be in the run dir
    cfg = load_config(None, [*BASE, "buffer.total_steps=2"])
    summary = explore(cfg, run_dir, progress=False, engines=engines, mlflow_uri=mlflow)
    assert summary.experiences == 2 * BATCH * REPEAT
    assert is_file(join(run_dir, CONFIG)) and is_file(join(run_dir, EXPLORER_STATE))
    assert ExplorerState.load(run_dir).latest_step == 2

    reader = open_reader(run_dir)  # the trainer's view: its store from the config.yaml on S3
    steps = dict(reader.steps())
    assert sorted(steps) == [1, 2]
    assert all(table.num_rows == BATCH * REPEAT for table in steps.values())
    before = {step: keys(table) for step, table in steps.items()}

    # A crash while committing step 3: its fragments copied into step_000003/, no marker written. A fragment
    # of the crashed attempt that no later record names must never be read.
    experiences = join(run_dir, "experiences")
    crashed = write_fragments(make_results([("crashed-task", 3, 2)]), experiences)
    fs, root = filesystem(experiences)
    name = crashed.column("fragment")[0].as_py()
    fs.copy_file(f"{root}/_pending/step_000003/{name}", f"{root}/step_000003/{name}")
    assert reader.committed_steps() == [1, 2]  # invisible without its marker

    resumed = load_config(None, [*BASE, "buffer.total_steps=3"])
    explore(resumed, run_dir, progress=False, engines=engines, mlflow_uri=mlflow)
    after = dict(open_reader(run_dir).steps())
    assert sorted(after) == [1, 2, 3]
    assert {step: keys(after[step]) for step in (1, 2)} == before  # committed steps untouched
    step3 = after[3]
    assert step3.num_rows == BATCH * REPEAT and len(set(keys(step3))) == BATCH * REPEAT
    assert "crashed-task" not in step3.column("task_uid").to_pylist()
    listed = fs.get_file_info(pafs.FileSelector(f"{root}/step_000003"))
    assert name not in {info.base_name for info in listed}  # the crashed copy was removed, not published
    assert COMMIT_MARKER in {info.base_name for info in listed}
    assert fs.get_file_info(f"{root}/_pending").type == pafs.FileType.NotFound
