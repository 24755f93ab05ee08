"""What every rftflow command shares: `--config`/`--set`, console logging that keeps the progress bar whole
(tqdm's logging redirect) at INFO, or DEBUG with `-v`, and the one rule for errors before an engine starts.

The rule (`run_cli`): bad input (config, run dir, tasksets, model, plugins, saved state) exits 2 with one
line, `error: <file[:line]>[, field '<key>']: <what>; <hint>`, and a traceback only with `-v`. A failure once
the run is under way is the run's own: it goes up unchanged (a traceback, exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from tqdm.contrib.logging import logging_redirect_tqdm

from operators.rollout.plugins import PluginError
from pipelines.control.native_stderr import native_notices_filtered
from pipelines.control.runtime import InputsPhase, reading_inputs
from schemas.errors import InputError
from schemas.secrets import mask_text
from schemas.storage import Location, as_location, is_remote

PACKAGES = ("pipelines", "operators", "schemas")  # rftflow's own loggers; Ray's and vLLM's are left alone
REFUSALS = (InputError, PluginError, NotImplementedError)  # bad input wherever raised (NotImplementedError:
# a workflow asked for what it cannot do, found when the workflows are checked)
READ_ERRORS = (OSError, UnicodeError)  # bad input while only inputs are read; the run's failure after
OS_HINTS = (
    (PermissionError, "check its permissions"),
    (IsADirectoryError, "give a file, not a directory"),
    (NotADirectoryError, "a folder on its path is a file"),
    (FileNotFoundError, "check the path"),
)


def given_path(text: str) -> Path:
    """An argparse `type` for a path argument: an empty one is refused (as `Path("")` it would be the
    working directory, and a run would read or write whatever is there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or folder")
    return Path(text)


def given_location(text: str) -> Location:
    """An argparse `type` for a run dir: a local path (as `given_path`), or an object-store URI kept as text
    (`s3://bucket/prefix?...`, see `schemas.storage`)."""
    return as_location(text) if is_remote(text) else given_path(text)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config` and `--set`, the same in every rftflow command that reads a config."""
    parser.add_argument(
        "--config", type=given_path, help="YAML config file (fields documented in docs/config-table.md)"
    )
    add_set_argument(parser)


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """`--set KEY=VALUE`, repeatable, into `args.overrides` (also the benchmark scripts' option)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field by dotted path, e.g. --set buffer.batch_size=16 (repeatable)",
    )


def run_cli(command: Callable[[], int], verbose: bool) -> int:
    """`command()`'s exit status, or 2 with one `error:` line when it fails on bad input.

    `REFUSALS` are bad input wherever raised. An OSError or UnicodeError is bad input while the command is
    still reading its inputs (`runtime.InputsPhase`: until `init_ray`, since Ray starts only once every input
    has been checked). After that it is the run's failure and goes up unchanged. With `verbose` the traceback
    is printed too. Unless `verbose`, known native notices are kept off the console (`native_stderr`).
    """
    with reading_inputs(), native_notices_filtered(active=not verbose):
        try:
            return command()
        except REFUSALS as exc:
            return refuse(exc, verbose)
        except READ_ERRORS as exc:
            if not InputsPhase.reading:
                raise
            error = as_input_error(exc)
            error.__cause__ = exc  # -v shows where it was raised
            return refuse(error, verbose)


def as_input_error(exc: OSError | UnicodeError) -> InputError:
    """An OSError or UnicodeError as a located InputError: the file (when the error names one), what went
    wrong, and what to do about it."""
    if isinstance(exc, UnicodeDecodeError):
        return InputError(f"not {exc.encoding} text ({exc.reason} at byte {exc.start}): save it as UTF-8")
    if isinstance(exc, UnicodeError):
        return InputError(f"not valid text ({exc}): save it as UTF-8")
    hint = next((h for kind, h in OS_HINTS if isinstance(exc, kind)), "check that it can be read")
    file = None if exc.filename is None else str(exc.filename)
    return InputError(f"cannot be read ({exc.strerror or exc}): {hint}", file=file)


def refuse(exc: BaseException, verbose: bool) -> int:
    """Bad input, found before any engine started: one located `error:` line (and the traceback with
    `-v`); exit code 2."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"error: {mask_text(str(exc))}", file=sys.stderr)
    return 2


class MaskingFormatter(logging.Formatter):
    """Every console log line with its URL passwords masked (`schemas.secrets`), whoever logged it."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_text(super().format(record))


@contextlib.contextmanager
def logging_to_console(verbose: bool) -> Iterator[None]:
    """rftflow's log lines on stderr, one message a line, written above any progress bar while it runs."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter("%(message)s"))
    loggers = [logging.getLogger(name) for name in PACKAGES]
    saved = [(logger.level, logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG if verbose else logging.INFO)
        logger.propagate = False  # a caller's root handler (pytest's, an app's) would print each line twice
    try:
        with logging_redirect_tqdm(loggers=loggers):
            yield
    finally:
        for logger, (level, propagate) in zip(loggers, saved, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
