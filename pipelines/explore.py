"""`python -m pipelines.explore`: stream a taskset through rollout workflows on vLLM engines.

With no arguments it runs the embedded default on CPU: the bundled arithmetic taskset, the bundled tiny
Llama model, Parquet experiences and an MLflow run under `runs/`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.cli import add_config_arguments, given_location, given_path, logging_to_console, run_cli
from pipelines.control.commands import report_command
from pipelines.control.console import console_defaults
from pipelines.control.fleet import EngineFleet
from pipelines.control.trainer_run import (
    finish_trainer,
    follow_trainer,
    start_trainer,
    stop_following,
    stop_trainer,
)
from pipelines.report import make_report
from pipelines.report_lib.learning import FIGURE as LEARNING_FIGURE
from pipelines.report_lib.learning import Learning, write_learning
from schemas.config import Config, load_config
from schemas.errors import InputError
from schemas.run_end import NothingLeft
from schemas.secrets import mask_text
from schemas.storage import Location, display, is_remote

EPILOG = """\
examples:
  python -m pipelines.explore                           # embedded default, a few steps on CPU
  python -m pipelines.explore --steps 10 --set buffer.batch_size=16
  python -m pipelines.explore --config my.yaml --ray-address auto   # on a cluster
  python -m pipelines.explore --with-trainer --steps 20   # closed loop with the reference GRPO trainer
  python -m pipelines.explore --config trinity.yaml --dry-run   # a Trinity-RFT config, as translated

outputs (under --run-dir):
  experiences/step_NNNNNN/*.parquet   committed experiences, one folder per step
  mlflow.db                           MLflow tracking store (browse: the command the run prints)
  config.yaml                         the resolved configuration
  checkpoints/global_step_N/          model versions (with --with-trainer and checkpoint sync)
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.explore",
        description="Run rftflow's explorer: rollouts on vLLM engines, scored and written as experiences.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument(
        "--plugin-dir",
        dest="plugin_dirs",
        action="append",
        default=[],
        type=given_path,
        metavar="DIR",
        help="folder of your own workflow and reward modules; repeatable",
    )
    parser.add_argument(
        "--run-dir",
        type=given_location,
        help="where outputs go (default: runs/<name>-<timestamp>); or an object store every node reaches, "
        "e.g. s3://bucket/runs/x (then give --mlflow-uri; see docs/cluster.md)",
    )
    parser.add_argument(
        "--steps", type=int, help="number of steps to run (same as --set buffer.total_steps=N)"
    )
    parser.add_argument(
        "--ray-address", help="join a running Ray cluster, e.g. 'auto' (default: start one locally)"
    )
    parser.add_argument(
        "--mlflow-uri",
        help="MLflow tracking URI: a tracking server (http://host:5000; artifacts then go to the server's "
        "artifact store) or a database (default: sqlite:///<absolute run dir>/mlflow.db)",
    )
    parser.add_argument(
        "--with-trainer",
        action="store_true",
        help="also run the reference GRPO trainer (pipelines.train) on the experiences and sync its weights "
        "every step; sync_method defaults to checkpoint",
    )
    parser.add_argument(
        "--trainer-lr", type=float, default=None, help="the reference trainer's learning rate (default 2e-4)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything checked before an engine starts (config, tasksets, model, plugins, names, "
        "the run dir and the sink; the resume checks on an existing --run-dir), print the resolved config "
        "and what a run would do, and exit; starts and writes nothing",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. for log files)")
    parser.add_argument(
        "--report",
        action="store_true",
        help="at the end, write RUN_DIR/report/index.html and its figures and log them to MLflow "
        "(as python -m pipelines.report RUN_DIR)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show everything: Ray, Ray Data, vLLM (at INFO) and torch logs, normally errors only",
    )
    return parser.parse_args(argv)


DEFAULT_STEPS = 4  # the embedded default should finish in a few minutes on a laptop


def build_config(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.steps is not None:
        overrides.append(f"buffer.total_steps={args.steps}")
    cfg = load_config(args.config, overrides)
    explicit = args.steps is not None or any(o.startswith("buffer.total_steps") for o in overrides)
    if cfg.buffer.total_steps is None and not explicit and args.config is None:
        cfg.buffer.total_steps = DEFAULT_STEPS
    cfg.plugin_dirs = [Path(p).resolve() for p in [*cfg.plugin_dirs, *args.plugin_dirs]]
    if args.with_trainer and cfg.synchronizer.sync_method == "none":
        cfg.synchronizer.sync_method = "checkpoint"
    return cfg


@dataclass
class Summary:
    steps: int
    experiences: int
    multi_turn: int  # experiences of more than one turn
    failed_tasks: int
    mean_reward: float
    tokens_per_s: float  # generated tokens over the sampling time (`pipelines.control.throughput`)
    seconds: float  # the sampling time: the union of the steps' sampling windows
    wall_seconds: float  # the whole command: engine start, evals and shutdown included
    run_dir: Location
    tracking_uri: str
    mlflow_run_id: str
    store: str  # where the committed experiences are: the sink's description
    browse: str  # how to look at the MLflow run (`tracking.browse_hint`)
    model_version: int = 0
    step_rewards: dict[int, float] = field(default_factory=dict)
    skipped_tasks: int = 0  # cut by over-rollout: accounted for, never run again
    learning: Learning | None = None  # with a trainer: its before and after

    def render(self) -> str:
        lines = [
            f"rftflow explore finished: {self.steps} steps, {self.experiences} experiences "
            f"({self.multi_turn} multi-turn), {self.failed_tasks} failed tasks"
            + (f", {self.skipped_tasks} skipped by over-rollout" if self.skipped_tasks else ""),
            f"  mean reward {self.mean_reward:.3f} | {self.tokens_per_s:.0f} generated tokens/s over "
            f"{self.seconds:.1f} s of sampling | {self.wall_seconds:.1f} s in all (start, shutdown too)",
        ]
        if self.learning is not None:
            lines += [
                f"  model version {self.model_version}",
                self.learning.render(),
                f"  learning curves: {self.run_dir / LEARNING_FIGURE}",
            ]
        elif self.model_version:
            first, last = min(self.step_rewards), max(self.step_rewards)
            lines.append(
                f"  model version {self.model_version} | reward step {first}: {self.step_rewards[first]:.3f}"
                f" -> step {last}: {self.step_rewards[last]:.3f}"
            )
        return "\n".join(
            [
                *lines,
                f"  experiences: {self.store}",
                f"  mlflow:      {mask_text(self.tracking_uri)} (run {self.mlflow_run_id})",
                f"  browse:      {mask_text(self.browse)}",
            ]
        )


def explore(
    cfg: Config,
    run_dir: Location,
    *,
    ray_address: str | None = None,
    mlflow_uri: str | None = None,
    progress: bool = True,
    engines: EngineFleet | None = None,
    verbose: bool = False,
    with_trainer: bool = False,
    trainer_lr: float | None = None,
) -> Summary | NothingLeft:
    """Run (or resume) an explore run to its end with the `Explorer`, and summarise it.

    `engines` lets a caller (a benchmark, a test) reuse a started `EngineFleet`; it is then left running.
    Input errors surface before any engine starts; a failed run keeps its committed steps and nothing else.
    """
    # --help and input errors answer without Ray and MLflow, which the explorer imports
    from pipelines.control.explorer import Explorer  # heavy, deferred (see above)
    from pipelines.control.tracking import browse_hint  # heavy (MLflow), deferred as the explorer

    explorer = Explorer(
        cfg,
        run_dir,
        ray_address=ray_address,
        mlflow_uri=mlflow_uri,
        progress=progress,
        verbose=verbose,
        engines=engines,
    )

    learned: list[Learning | None] = []  # measured before the MLflow run closes
    began = time.monotonic()

    async def run() -> None:
        trainer = follower = None
        try:
            await explorer.prepare()
            if with_trainer and explorer.stream is not None:  # None: a finished run given again (`run_end`)
                trainer = start_trainer(explorer, trainer_lr)
                follower = follow_trainer(trainer, explorer.monitor)
            await explorer.explore()
            if trainer is not None and cfg.synchronizer.sync_method == "checkpoint":
                await finish_trainer(trainer, cfg.synchronizer.sync_timeout)
            if trainer is not None:
                learned.append(await asyncio.to_thread(measure_learning, explorer))
        finally:
            if follower is not None:
                await stop_following(*follower)
            if trainer is not None:
                stop_trainer(trainer)
            await explorer.shutdown()

    asyncio.run(run())
    if explorer.stream is None:
        return NothingLeft(explorer.plan.num_steps, explorer.run_dir)
    totals = explorer.totals
    sampling = totals["sampling_s"]
    return Summary(
        steps=explorer.plan.num_steps,
        experiences=totals["experiences"],
        multi_turn=totals["multi_turn"],
        failed_tasks=totals["failed"],
        mean_reward=totals["rewards"] / totals["experiences"] if totals["experiences"] else float("nan"),
        tokens_per_s=totals["tokens"] / sampling if sampling else 0.0,
        seconds=sampling,
        wall_seconds=time.monotonic() - began,
        run_dir=explorer.run_dir,
        tracking_uri=explorer.tracking_uri,
        mlflow_run_id=explorer.monitor.run_id,
        store=explorer.sink.describe(),
        browse=browse_hint(explorer.tracking_uri),
        model_version=explorer.state.model_version,
        step_rewards=explorer.reporter.step_rewards if explorer.reporter else {},
        skipped_tasks=totals["skipped"],
        learning=learned[0] if learned else None,
    )


def measure_learning(explorer: Any) -> Learning | None:
    """The run's before and after (`pipelines.report_lib.learning`), its figure logged to MLflow too.
    Read from a local run dir only, as the report is (a remote one: None, said in the log)."""
    if is_remote(explorer.run_dir):
        logging.getLogger(__name__).info("learning.png is drawn for a local run dir only")
        return None
    found, figure = write_learning(explorer.run_dir)
    if figure is not None:
        explorer.monitor.log_artifact(figure)
    return found


def bench(cfg: Config, run_dir: Path, **options) -> bool:
    """`mode: bench` (Trinity-RFT's mode of that name): benchmark the checkpoints in
    `synchronizer.checkpoint_dir` with `Explorer.benchmark()`, as `python -m pipelines.bench` would; True
    when no checkpoint failed. `options` are the `Explorer`'s (ray_address, mlflow_uri, progress, engines...).
    """
    from pipelines.control.explorer import Explorer  # heavy, deferred (see explore)

    explorer = Explorer(cfg, run_dir, **options)

    async def run() -> bool:
        try:
            return await explorer.benchmark()
        finally:
            await explorer.shutdown()

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    """0: the run finished; 2: bad input, nothing run (one `error:` line, see `pipelines.cli.run_cli`)."""
    args = parse_args(argv)
    console_defaults(args.verbose)
    return run_cli(lambda: run_command(args), args.verbose)


def run_command(args: argparse.Namespace) -> int:
    if args.dry_run:
        with logging_to_console(args.verbose):
            from pipelines.control.dry_run import explore_dry_run  # heavy (Ray Data's sinks), deferred

            print(explore_dry_run(build_config(args), args.run_dir, args.mlflow_uri))
        return 0
    common = {
        "ray_address": args.ray_address,
        "mlflow_uri": args.mlflow_uri,
        "progress": not args.no_progress,
        "verbose": args.verbose,
    }
    with logging_to_console(args.verbose):
        cfg = build_config(args)  # on the console too: a Trinity-RFT config's translation notices
        run_dir = args.run_dir or Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        if args.report and is_remote(run_dir):
            raise InputError(
                "--report reads a local run dir: drop it, or copy the run dir here and run pipelines.report",
                file=display(run_dir),
            )
        if cfg.mode == "bench":
            ok = bench(cfg, run_dir, **common)
        else:
            summary = explore(
                cfg, run_dir, with_trainer=args.with_trainer, trainer_lr=args.trainer_lr, **common
            )
    if cfg.mode == "bench":
        results = Path(run_dir) / "bench_results.md"
        print(f"rftflow bench finished, {'every' if ok else 'not every'} checkpoint measured: {results}")
        if args.report:
            print(f"report: {make_report(run_dir).index}")
        else:
            print(f"report: {report_command(run_dir)} (or --report next time)")
        return 0 if ok else 1
    print(summary.render())
    if is_remote(summary.run_dir):
        print(f"  run dir:     {display(summary.run_dir)}")
    elif args.report:
        print(f"  report:      {make_report(summary.run_dir).index}")
    else:
        print(f"  report:      {report_command(summary.run_dir)} (or --report next time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
