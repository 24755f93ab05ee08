"""The command line the generated docs pages share (`config_table.py`, `trinity_keys.py`): `--check` exits 1
naming the first stale line and the command that mends it; without it the page is rewritten in place."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def page_main(
    doc: str,
    script: str,
    check: Callable[[Path], str | None],
    write: Callable[[Path], bool],
    page: Path,
    argv: list[str] | None = None,
    errors: tuple[type[Exception], ...] = (),
) -> int:
    """Run a page generator's command line. `doc` is the generator's docstring (its first line describes it),
    `script` its file name; `errors` are its own exceptions, reported as one line with exit 1."""
    parser = argparse.ArgumentParser(prog=f"python docs/{script}", description=doc.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    parser.add_argument("--page", type=Path, default=page, help="the file to check or rewrite")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problem = check(args.page)
            if problem:
                print(f"{args.page}: out of date: {problem}", file=sys.stderr)
                print(f"run: python docs/{script}", file=sys.stderr)
                return 1
            return 0
        print(f"{args.page}: {'rewritten' if write(args.page) else 'already up to date'}")
        return 0
    except errors as exc:
        print(f"{args.page}: {exc}", file=sys.stderr)
        return 1
