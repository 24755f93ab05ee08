"""`python -m pipelines.bench`: benchmark a list of checkpoints on the eval tasksets, tracked in MLflow.

The engines start once, with the config's model; each checkpoint is then loaded in place (the same reload a
weight sync uses), so a benchmark of N checkpoints pays one engine start, not N. Every checkpoint is checked
before any engine sees it, and a bad one is reported and skipped while the others go on. With a LoRA config
(`model.lora`) the checkpoints are adapters of the config's model, each loaded as an adapter version.

Results are kept in `<run dir>/bench_state.json`, keyed by the weights' sha256, the taskset and the sampling
settings, so a rerun (or a `--watch` that restarts) skips what it has already measured. `Explorer.benchmark()`
runs the same loop (`pipelines.benchmark`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from pipelines.benchmark.selection import DEFAULT_TIMEOUT_S, Selection
from pipelines.cli import add_config_arguments, given_path, logging_to_console, run_cli
from pipelines.control.commands import report_command
from pipelines.control.console import console_defaults
from pipelines.control.fleet import EngineFleet
from pipelines.report import make_report
from schemas.config import load_config

EPILOG = """\
examples:
  python -m pipelines.bench --checkpoint-dir runs/explore-X/checkpoints --include-base
  python -m pipelines.bench --checkpoints ckpt/a ckpt/b --taskset data/test.jsonl --taskset data/hard.jsonl
  python -m pipelines.bench --checkpoint-dir ckpts --watch --timeout 7200 --run-dir runs/bench-live

outputs (under --run-dir):
  bench_results.csv, bench_results.md   one row per checkpoint and eval taskset, with 95% intervals
  bench_plot.png                        each metric against the checkpoint step, with its interval
  bench_state.json                      what was measured (a rerun skips it), the MLflow parent run
  bench/step_N-<hash>/<taskset>.parquet the eval experiences of each checkpoint
  mlflow.db                             one parent run, a nested child run per checkpoint
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.bench",
        description="Benchmark checkpoints on the eval tasksets: one engine start, an in-place reload per "
        "checkpoint, metrics with 95% intervals in MLflow, a table and a plot.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--run-dir",
        type=given_path,
        help="where outputs go (default: runs/bench-<timestamp>); an existing one is resumed",
    )
    parser.add_argument(
        "--checkpoints",
        nargs="+",
        type=given_path,
        default=[],
        metavar="PATH",
        help="Hugging Face model directories, in any order (run by their step: global_step_N, a trailing "
        "number, else their position)",
    )
    parser.add_argument(
        "--checkpoint-dir", type=given_path, metavar="DIR", help="every global_step_N under DIR, by N"
    )
    parser.add_argument("--include-base", action="store_true", help="also the config's model, as step 0")
    parser.add_argument("--latest-only", action="store_true", help="only the highest step (and the base)")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="keep evaluating new global_step_N in --checkpoint-dir until --timeout, or until the trainer's "
        "status says stopped",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long --watch goes on (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--taskset",
        dest="tasksets",
        action="append",
        default=[],
        type=given_path,
        metavar="PATH",
        help="an eval taskset file or folder, named by its stem, in place of the config's eval tasksets; "
        "repeatable (default: the config's, else the bundled arithmetic eval set)",
    )
    parser.add_argument(
        "--force", action="store_true", help="evaluate again what this run dir already measured"
    )
    parser.add_argument(
        "--ray-address", help="join a running Ray cluster, e.g. 'auto' (default: start one locally)"
    )
    parser.add_argument(
        "--mlflow-uri", help="MLflow tracking URI (default: sqlite:///<absolute run dir>/mlflow.db)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config, tasksets, model and every checkpoint as a run would before an engine starts, "
        "print the resolved config and what would be measured, and exit; starts and writes nothing",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. for log files)")
    parser.add_argument(
        "--report",
        action="store_true",
        help="at the end, write RUN_DIR/report/index.html and its figures and log them to the parent MLflow "
        "run (as python -m pipelines.report RUN_DIR)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, and a traceback with each input error"
    )
    args = parser.parse_args(argv)
    if args.watch and args.checkpoint_dir is None:
        parser.error("--watch needs --checkpoint-dir")
    return args


def selection_of(args: argparse.Namespace) -> Selection:
    return Selection(
        checkpoints=list(args.checkpoints),
        checkpoint_dir=args.checkpoint_dir,
        include_base=args.include_base,
        latest_only=args.latest_only,
        watch=args.watch,
        timeout=args.timeout,
    )


def main(argv: list[str] | None = None, engines: EngineFleet | None = None) -> int:
    """0: every checkpoint measured (or already measured); 1: some failed; 2: bad input, nothing run."""
    args = parse_args(argv)
    console_defaults(args.verbose)
    return run_cli(lambda: run_command(args, engines), args.verbose)  # the `error:` rule: pipelines.cli


def run_command(args: argparse.Namespace, engines: EngineFleet | None) -> int:
    with logging_to_console(args.verbose):
        # --help and argument errors answer without Ray, MLflow and the engines' code
        from pipelines.benchmark.session import bench_dry_run, benchmark  # heavy, deferred (see above)

        cfg = load_config(args.config, args.overrides)
        run_dir = args.run_dir or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
        if args.dry_run:
            print(bench_dry_run(cfg, run_dir, selection_of(args), args.tasksets))
            return 0
        report, tracking_uri = benchmark(
            cfg,
            run_dir,
            selection_of(args),
            taskset_paths=args.tasksets,
            force=args.force,
            ray_address=args.ray_address,
            mlflow_uri=args.mlflow_uri,
            progress=not args.no_progress,
            engines=engines,
        )
    print(report.render(tracking_uri))
    if args.report:
        print(f"report: {make_report(run_dir).index}")
    else:
        print(f"report: {report_command(run_dir)} (or --report next time)")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
