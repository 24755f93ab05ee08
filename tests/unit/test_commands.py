"""The commands a run prints at its end work as printed, also from outside the checkout."""

from __future__ import annotations

import subprocess

from pipelines.control.commands import mlflow_ui_command, report_command


def test_the_printed_report_and_mlflow_commands_run_as_printed(tmp_path, monkeypatch):
    cwd = tmp_path
    monkeypatch.chdir(cwd)
    not_a_run = tmp_path / "not a run"  # a space: the path is quoted
    not_a_run.mkdir()
    report = subprocess.run(report_command(not_a_run), shell=True, cwd=cwd, capture_output=True, text=True)
    assert report.returncode == 2 and "error:" in report.stderr, report.stderr  # the report's own refusal
    ui = mlflow_ui_command(f"sqlite:///{tmp_path}/mlflow.db") + " --help"
    browse = subprocess.run(ui, shell=True, cwd=cwd, capture_output=True, text=True)
    assert browse.returncode == 0 and "--backend-store-uri" in browse.stdout, browse.stderr
