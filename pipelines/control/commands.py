"""The commands rftflow prints for the user to run next (the report, the MLflow UI), written so they work as
printed from a new shell in the working directory: with the interpreter that runs rftflow now (`.venv`'s,
after `make explore`), not whatever `python` or `mlflow` a shell finds on its PATH."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from schemas.secrets import MASK, is_secret_key, mask_text
from schemas.storage import Location, display

COMMAND_TAG = "rftflow.command"  # the MLflow tag that records the command a run was started with


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


def invoked_command() -> str:
    """The command line that started this process, as it would be typed again (`python -m module args`
    when run with `-m`), with credentials masked: URL passwords, and the value of any `KEY=VALUE` whose
    key names a secret (`--set monitor.api_key=...`)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = [f"-m {spec.name}"] if spec is not None else [shlex.quote(sys.argv[0])]
    args = [shlex.quote(masked_argument(arg)) for arg in sys.argv[1:]]
    return " ".join([python_command(), *head, *args])


def masked_argument(arg: str) -> str:
    key, sep, _ = arg.partition("=")
    if sep and is_secret_key(key.rsplit(".", 1)[-1]):
        return f"{key}={MASK}"
    return mask_text(arg)
