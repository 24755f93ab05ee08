"""What every rftflow command shares: `--config`/`--set`, and console logging that keeps the progress bar
whole (tqdm's logging redirect) at INFO, or DEBUG with `-v`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

from tqdm.contrib.logging import logging_redirect_tqdm

PACKAGES = ("pipelines", "operators", "schemas")  # rftflow's own loggers; Ray's and vLLM's are left alone


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """`--config` and `--set`, the same in every rftflow command that reads a config."""
    parser.add_argument("--config", type=Path, help="YAML config file (fields documented in the README)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field by dotted path, e.g. --set buffer.batch_size=16 (repeatable)",
    )


def refuse(exc: BaseException, verbose: bool) -> int:
    """Bad input, found before any engine started: one located `error:` line (and the traceback with
    `-v`); exit code 2."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"error: {exc}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def logging_to_console(verbose: bool) -> Iterator[None]:
    """rftflow's log lines on stderr, one message a line, written above any progress bar while it runs."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
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
