"""`--dry-run` makes the checks a run makes before its engines start, whether or not the run dir exists."""

from __future__ import annotations

import pytest
from unit_factories import write_and_commit

from operators.sinks.base import open_sink
from pipelines.control.state import ExplorerState
from pipelines.explore import main as explore_main
from schemas.config import DEFAULT_EVAL, ExperienceBufferConfig
from schemas.run_end import mark_finished

SQL = "buffer.trainer_input.experience_buffer.storage_type=sql"
URL = "buffer.trainer_input.experience_buffer.path"


@pytest.mark.parametrize("where", ["no run dir", "a new run dir"])
@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("sqlite://", "an in-memory SQLite database loses the experiences"),
        ("postgresql+psycopg://rft:hunter22@127.0.0.1:1/rft", "cannot use postgresql+psycopg://rft:***@"),
    ],
    ids=["in-memory SQLite", "unreachable PostgreSQL"],
)
def test_a_store_a_run_refuses_is_refused_by_the_dry_run(url, said, where, tmp_path, capsys):
    run_dir = ["--run-dir", str(tmp_path / "run")] if where == "a new run dir" else []
    assert explore_main(["--dry-run", "--set", SQL, "--set", f"{URL}={url}", *run_dir]) == 2
    out, err = capsys.readouterr()
    assert said in err and "hunter22" not in out + err
    assert not (tmp_path / "run").exists()


def test_skipped_bad_rows_are_counted_with_their_reasons(tmp_path, capsys):
    lines = DEFAULT_EVAL.read_text().splitlines()[:8]
    taskset = tmp_path / "mixed.jsonl"
    taskset.write_text("\n".join([*lines[:4], "{broken", *lines[4:], '{"prompt": "no answer"}']) + "\n")
    skip = ["--set", f"buffer.explorer_input.taskset.path={taskset}"]
    skip += ["--set", "buffer.explorer_input.taskset.on_bad_row=skip", "--steps", "1", "--dry-run"]
    assert explore_main(skip) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith("taskset 'arith': a run would skip 2 bad rows, e.g. ")
    assert "mixed.jsonl:5" in said and "mixed.jsonl:10" in said  # where, and why, each one is


@pytest.mark.parametrize("marked", [True, False], ids=["finished", "crashed after its last commit"])
def test_a_finished_run_s_dry_run_says_no_steps_are_left(marked, tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_and_commit(open_sink(ExperienceBufferConfig(), run_dir), [(f"t{s}", s, 1) for s in (1, 2)])
    ExplorerState(latest_step=2, mlflow_run_id="r").save(run_dir)
    if marked:
        mark_finished(run_dir, 2)
    assert explore_main(["--steps", "2", "--run-dir", str(run_dir), "--dry-run"]) == 0
    said = capsys.readouterr().out.splitlines()[-1]
    assert said.startswith(f"{run_dir} has committed all its 2 steps: no steps are left")
    assert ("a run would start nothing" in said) == marked
    assert explore_main(["--steps", "3", "--run-dir", str(run_dir), "--dry-run"]) == 0
    assert "a run would resume" in capsys.readouterr().out
