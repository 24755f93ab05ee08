"""Errors before any engine starts, through the CLIs in process: exit 2, one located `error:` line, no
traceback, and Ray never started."""

from __future__ import annotations

import json

import pytest

from pipelines.bench import main as bench_main
from pipelines.explore import main as explore_main
from schemas.run_dir import BENCH_STATE, EXPLORER_STATE


def refused(capsys, code: int, *fragments: str) -> None:
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


def test_a_run_dir_that_is_a_file_is_refused_by_both_commands(tmp_path, capsys):
    not_a_dir = tmp_path / "run"
    not_a_dir.write_text("")
    refused(
        capsys,
        explore_main(["--run-dir", str(not_a_dir), "--no-progress"]),
        str(not_a_dir),
        "not a directory",
    )
    code = bench_main(["--include-base", "--run-dir", str(not_a_dir), "--no-progress"])
    refused(capsys, code, str(not_a_dir), "not a directory")


@pytest.mark.parametrize(
    "text", ['{"latest_step": 2, "mlflow_ru', '{"latest_step": "many"}', "[]", "\xff\xfe"]
)
def test_a_cut_off_or_corrupt_explorer_state_says_how_to_recover(tmp_path, capsys, text):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / EXPLORER_STATE).write_text(text, encoding="latin-1")
    code = explore_main(["--run-dir", str(run_dir), "--no-progress"])
    refused(capsys, code, str(run_dir / EXPLORER_STATE), "move it away")


def test_a_cut_off_bench_state_says_how_to_recover(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / BENCH_STATE).write_text(json.dumps({"records": []})[:-3])
    code = bench_main(["--include-base", "--run-dir", str(run_dir), "--no-progress"])
    refused(capsys, code, str(run_dir / BENCH_STATE), "move it away")


def test_a_config_in_another_encoding_is_located(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("buffer:\n  batch_size: 4\n", encoding="utf-16")
    refused(capsys, explore_main(["--config", str(config), "--no-progress"]), str(config), "UTF-8")


def test_a_taskset_path_that_is_a_directory_of_the_wrong_kind_is_located(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code = explore_main(
        ["--set", f"buffer.explorer_input.taskset.path={empty}", "--run-dir", str(tmp_path / "r")]
    )
    refused(capsys, code, str(empty))


def test_with_verbose_the_traceback_comes_with_the_located_line(tmp_path, capsys):
    not_a_dir = tmp_path / "run"
    not_a_dir.write_text("")
    code = bench_main(["--include-base", "--run-dir", str(not_a_dir), "--no-progress", "-v"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and f"error: {not_a_dir}: is not a directory" in err
