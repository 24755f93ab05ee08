"""`python -m pipelines.report RUN_DIR`: a run's report, `RUN_DIR/report/index.html` with its figures as PNGs,
logged to the run's MLflow run as the `report/` artifact.

It reads only what the run wrote (experiences, eval experiences, `mlflow.db`, `mlartifacts/`), found by
the run dir's own layout, so a run dir copied elsewhere still reports. The notebooks in `notebooks/` draw
the same figures with the same functions (`pipelines.report_lib`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pipelines.cli import given_path, logging_to_console, run_cli
from pipelines.report_lib.mlflow_store import log_report
from pipelines.report_lib.page import Report, write_report
from pipelines.report_lib.runs import open_run

log = logging.getLogger(__name__)

EPILOG = """\
examples:
  python -m pipelines.report runs/explore-20261202-130000
  python -m pipelines.report runs/bench-20261202-140000 --no-mlflow

what it reads (the kind of run is told by the files in RUN_DIR):
  explore run   config.yaml, experiences/ or experiences.db, eval/, mlflow.db, mlartifacts/
  bench run     bench_results.csv, bench_state.json, mlflow.db

what it writes:
  RUN_DIR/report/index.html and its PNG figures, also logged to the run's MLflow run (the explorer's run,
  or the bench's parent run) as the artifact folder report/

exit codes: 0 written; 2 bad input (no such directory, not a run directory), with one `error:` line
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.report",
        description="Write a run's report (HTML page and PNG figures) into RUN_DIR/report/ and log it to the "
        "run's MLflow run. Works for explore and bench run dirs, also copied or moved ones.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", type=given_path, metavar="RUN_DIR", help="an explore or bench run dir")
    parser.add_argument(
        "--no-mlflow", action="store_true", help="only write the files; do not log them to MLflow"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, and a traceback with an input error"
    )
    return parser.parse_args(argv)


def make_report(run_dir: Path | str, log_to_mlflow: bool = True) -> Report:
    """Write the report of the run in `run_dir` and (unless told not to) log it to its MLflow run.

    Bad input (a missing path, a folder that is no run dir) is an `InputError` naming the path.
    """
    run = open_run(run_dir)
    report = write_report(run)
    if log_to_mlflow:
        where = log_report(run, report.folder)
        if where is not None:
            log.info("report logged to MLflow run %s: %s", run.run_id, where)
    return report


def main(argv: list[str] | None = None) -> int:
    """0: report written; 2: bad input (one `error:` line, see `pipelines.cli.run_cli`)."""
    args = parse_args(argv)

    def command() -> int:
        with logging_to_console(args.verbose):
            report = make_report(args.run_dir, log_to_mlflow=not args.no_mlflow)
        print(f"report: {report.index}")
        return 0

    return run_cli(command, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
