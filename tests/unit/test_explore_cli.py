"""The explore CLI without running anything: options, config building, failure messages, import weight."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from unit_factories import make_results

from pipelines.control.step_report import failure_messages
from pipelines.explore import DEFAULT_STEPS, build_config, main, parse_args
from schemas.errors import InputError

OPTIONS = ("--config", "--set", "--run-dir", "--steps", "--ray-address", "--mlflow-uri", "--no-progress")


def config_for(argv: list[str]):
    return build_config(parse_args(argv))


def test_help_exits_zero_and_documents_every_option(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    missing = [option for option in OPTIONS if option not in text]
    assert missing == []
    assert "buffer.batch_size=16" in text  # the --set example


def test_parse_args_collects_options(tmp_path):
    args = parse_args(
        ["--set", "a=1", "--set", "b=2", "--steps", "3", "--run-dir", str(tmp_path), "--ray-address", "auto"]
    )
    assert args.overrides == ["a=1", "b=2"]
    assert (args.steps, args.run_dir, args.ray_address, args.mlflow_uri) == (3, tmp_path, "auto", None)
    assert args.config is None and args.no_progress is False


def test_steps_option_sets_total_steps():
    assert config_for(["--steps", "3"]).buffer.total_steps == 3
    assert config_for(["--set", "buffer.total_steps=9", "--steps", "3"]).buffer.total_steps == 3


def test_no_arguments_run_a_few_default_steps():
    cfg = config_for([])
    assert cfg.buffer.total_steps == DEFAULT_STEPS
    assert 1 <= DEFAULT_STEPS <= 10


def test_explicit_null_steps_means_all_epochs():
    assert config_for(["--set", "buffer.total_steps=null"]).buffer.total_steps is None


def test_a_config_file_keeps_its_own_total_steps(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"buffer": {"batch_size": 2}}))
    assert config_for(["--config", str(path)]).buffer.total_steps is None
    path.write_text(yaml.safe_dump({"buffer": {"total_steps": 7}}))
    assert config_for(["--config", str(path)]).buffer.total_steps == 7


def test_bad_steps_are_an_input_error():
    with pytest.raises(InputError, match="buffer.total_steps"):
        config_for(["--steps", "0"])


def test_main_reports_input_errors_with_exit_code_2(capsys):
    code = main(["--set", "buffer.explorer_input.taskset.bogus=1"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --set, field 'buffer.explorer_input.taskset.bogus'")


def failed_records(n_failed: int, n_ok: int = 2):
    spec = [(f"ok{i}", 1, 1) for i in range(n_ok)] + [(f"bad{i}", 1, 0) for i in range(n_failed)]
    return make_results(spec)


@pytest.mark.parametrize(
    ("n_failed", "limit", "expected"),
    [
        (5, 3, ["bad0: boom", "bad1: boom", "bad2: boom", "... and 2 more"]),
        (3, 3, ["bad0: boom", "bad1: boom", "bad2: boom"]),
        (2, 1, ["bad0: boom", "... and 1 more"]),
        (0, 3, []),
    ],
)
def test_failure_messages(n_failed, limit, expected):
    assert failure_messages(failed_records(n_failed), limit=limit) == expected


def test_driver_modules_import_without_ray_or_vllm():
    modules = [
        "schemas.config",
        "schemas.status",
        "schemas.task",
        "operators.tasks.reader",
        "operators.sinks.parquet",
        "operators.sinks.sql",
        "operators.sinks.reader",
        "operators.sinks.queue",
        "operators.rollout.rewards",
        "operators.engine.client",
        "pipelines.control.steps",
        "pipelines.control.metrics",
        "pipelines.explore",
    ]
    heavy = {"ray", "vllm", "torch"}
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint(sorted({heavy!r} & set(sys.modules)))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
