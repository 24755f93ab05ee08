"""The commands rftflow prints for the user to run next (the report, the MLflow UI), written so they work as
printed from a new shell in the working directory: with the interpreter that runs rftflow now (`.venv`'s,
after `make explore`), not whatever `python` or `mlflow` a shell finds on its PATH."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from schemas.storage import Location, display


def python_command() -> str:
    """This interpreter, relative to the working directory when under it (`.venv/bin/python`)."""
    executable = Path(sys.executable)
    try:
        shown = os.path.relpath(executable) if executable.is_relative_to(Path.cwd()) else str(executable)
    except ValueError:  # another drive (Windows)
        shown = str(executable)
    return shlex.quote(shown)


def report_command(run_dir: Location) -> str:
    return f"{python_command()} -m pipelines.report {shlex.quote(display(run_dir))}"


def mlflow_ui_command(tracking_uri: str) -> str:
    return f"{python_command()} -m mlflow ui --backend-store-uri {shlex.quote(tracking_uri)}"
