"""Errors before any engine starts, through the CLIs in process: exit 2, one located `error:` line, no
traceback, and Ray never started."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import pipelines.bench as bench_module
import pipelines.control.runtime as runtime
import pipelines.explore as explore_module
from pipelines.bench import main as bench_main
from pipelines.cli import run_cli
from pipelines.explore import main as explore_main
from schemas.run_dir import BENCH_STATE, EXPERIENCES, EXPLORER_STATE, step_dir_name


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


# -- the one rule (pipelines.cli.run_cli): more inputs, OSError before and after Ray ---------------------


@pytest.fixture(autouse=True)
def ray_never_started(monkeypatch):
    """Every refusal here comes before the run begins: `init_ray` is never reached."""

    def too_late(*args, **kwargs):
        raise AssertionError("an input error must be answered before Ray starts")

    for module in ("pipelines.control.explorer", "pipelines.benchmark.session"):
        monkeypatch.setattr(f"{module}.init_ray", too_late)


def test_committed_steps_without_an_explorer_state_are_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    (run_dir / EXPERIENCES / step_dir_name(1)).mkdir(parents=True)
    code = explore_main(["--run-dir", str(run_dir), "--no-progress"])
    refused(capsys, code, f"error: {run_dir}: ", "no explorer state", "new --run-dir")


def test_a_state_naming_steps_the_run_dir_does_not_hold_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / EXPLORER_STATE).write_text(json.dumps({"latest_step": 2, "mlflow_run_id": "abc"}))
    code = explore_main(["--run-dir", str(run_dir), "--no-progress"])
    refused(capsys, code, f"error: {run_dir}: ", "step 2 is committed", "experience_buffer", "new --run-dir")


def test_a_config_path_that_is_a_directory_is_refused_by_both_commands(tmp_path, capsys):
    folder = tmp_path / "conf.yaml"
    folder.mkdir()
    run = ["--config", str(folder), "--run-dir", str(tmp_path / "r"), "--no-progress"]
    refused(capsys, explore_main(run), f"error: {folder}: ", "directory")
    refused(capsys, bench_main([*run, "--include-base"]), f"error: {folder}: ", "directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode: no PermissionError")
def test_a_config_without_read_permission_is_located(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("buffer:\n  batch_size: 4\n")
    config.chmod(0)
    run = ["--config", str(config), "--run-dir", str(tmp_path / "r"), "--no-progress"]
    refused(capsys, explore_main(run), f"error: {config}: ", "permission denied")
    refused(capsys, bench_main([*run, "--include-base"]), f"error: {config}: ", "permission denied")


def denied(path: Path):
    """What an unreadable file raises, for root too (where chmod 000 stops no read)."""

    def load(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    return load


def test_an_os_error_before_ray_starts_is_one_located_line_in_both_commands(tmp_path, monkeypatch, capsys):
    config = tmp_path / "c.yaml"
    monkeypatch.setattr(explore_module, "build_config", denied(config))
    monkeypatch.setattr(bench_module, "load_config", denied(config))
    run = ["--config", str(config), "--run-dir", str(tmp_path / "r"), "--no-progress"]
    hints = (f"error: {config}: cannot be read (Permission denied): check its permissions",)
    refused(capsys, explore_main(run), *hints)
    refused(capsys, bench_main([*run, "--include-base"]), *hints)


def test_a_decoding_error_before_ray_starts_is_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    def load(*args, **kwargs):
        return b"\xff\xfe".decode("utf-8")

    monkeypatch.setattr(bench_module, "load_config", load)
    refused(capsys, bench_main(["--include-base", "--run-dir", str(tmp_path / "r")]), "save it as UTF-8")


def test_with_verbose_a_converted_os_error_shows_where_it_was_raised(tmp_path, monkeypatch, capsys):
    config = tmp_path / "c.yaml"
    monkeypatch.setattr(explore_module, "build_config", denied(config))
    code = explore_main(["--config", str(config), "--run-dir", str(tmp_path / "r"), "-v"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" in err and "PermissionError" in err
    assert err.rstrip().splitlines()[-1].startswith(f"error: {config}: cannot be read")


def test_an_os_error_once_ray_is_up_is_the_run_s_failure(tmp_path, monkeypatch):
    def begun_then_denied(args):
        runtime.InputsPhase.reading = False  # what init_ray does: the run is under way
        return denied(tmp_path / "c.yaml")(args)

    monkeypatch.setattr(explore_module, "build_config", begun_then_denied)
    with pytest.raises(PermissionError):  # `python -m` prints its traceback and exits 1
        explore_main(["--run-dir", str(tmp_path / "r")])


def test_run_cli_refuses_bad_input_and_lets_the_run_s_own_failures_go_up(capsys):
    def unsupported() -> int:
        raise NotImplementedError("workflow math cannot run multi-turn tasks")

    def crashed() -> int:
        raise RuntimeError("engine died")

    assert run_cli(unsupported, verbose=False) == 2
    assert capsys.readouterr().err == "error: workflow math cannot run multi-turn tasks\n"
    with pytest.raises(RuntimeError, match="engine died"):
        run_cli(crashed, verbose=False)
    assert run_cli(lambda: 1, verbose=False) == 1


@pytest.mark.parametrize("flag", ["--taskset", "--run-dir", "--config", "--checkpoint-dir"])
def test_an_empty_path_argument_is_a_usage_error_not_the_working_directory(flag, capsys):
    with pytest.raises(SystemExit) as info:
        bench_main(["--include-base", flag, ""])
    assert info.value.code == 2 and "an empty path" in capsys.readouterr().err
