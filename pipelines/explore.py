"""`python -m pipelines.explore`: stream a taskset through rollout workflows on vLLM engines.

With no arguments it runs the embedded default on CPU: the bundled arithmetic taskset, the bundled tiny
Llama model, Parquet experiences and an MLflow run under `runs/`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from pipelines.runtime import EngineSet
from schemas.config import Config, flatten, load_config
from schemas.errors import InputError

EPILOG = """\
examples:
  python -m pipelines.explore                           # embedded default, a few steps on CPU
  python -m pipelines.explore --steps 10 --set buffer.batch_size=16
  python -m pipelines.explore --config my.yaml --ray-address auto   # on a cluster

outputs (under --run-dir):
  experiences/step_NNNNNN/*.parquet   committed experiences, one folder per step
  mlflow.db                           MLflow tracking store (browse: mlflow ui --backend-store-uri sqlite:///...)
  config.yaml                         the resolved configuration
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.explore",
        description="Run rftflow's explorer: rollouts on vLLM engines, scored and written as experiences.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, help="YAML config file (fields documented in the README)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field by dotted path, e.g. --set buffer.batch_size=16 (repeatable)",
    )
    parser.add_argument("--run-dir", type=Path, help="where outputs go (default: runs/<name>-<timestamp>)")
    parser.add_argument(
        "--steps", type=int, help="number of steps to run (same as --set buffer.total_steps=N)"
    )
    parser.add_argument(
        "--ray-address", help="join a running Ray cluster, e.g. 'auto' (default: start one locally)"
    )
    parser.add_argument(
        "--mlflow-uri", help="MLflow tracking URI (default: sqlite:///<absolute run dir>/mlflow.db)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. for log files)")
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show Ray Data and vLLM logs (vLLM at INFO), normally hidden",
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
    return cfg


def failure_messages(records: pa.Table, limit: int = 3) -> list[str]:
    """A few failed tasks' messages, so a failing workflow is visible while the run goes on."""
    failed = records.filter(pc.invert(records.column("ok")))
    rows = failed.select(["task_uid", "message"]).slice(0, limit).to_pylist()
    more = len(failed) - len(rows)
    return [f"{r['task_uid']}: {r['message']}" for r in rows] + ([f"... and {more} more"] if more > 0 else [])


@dataclass
class Summary:
    steps: int
    experiences: int
    failed_tasks: int
    mean_reward: float
    tokens_per_s: float
    seconds: float
    run_dir: Path
    tracking_uri: str
    mlflow_run_id: str

    def render(self) -> str:
        return "\n".join(
            [
                f"rftflow explore finished: {self.steps} steps, {self.experiences} experiences, "
                f"{self.failed_tasks} failed tasks",
                f"  mean reward {self.mean_reward:.3f} | {self.tokens_per_s:.0f} generated tokens/s | "
                f"{self.seconds:.1f} s",
                f"  experiences: {self.run_dir / 'experiences'} (Parquet, one folder per committed step)",
                f"  mlflow:      {self.tracking_uri} (run {self.mlflow_run_id})",
                f"  browse:      mlflow ui --backend-store-uri {self.tracking_uri}",
            ]
        )


def prepare_run_dir(run_dir: Path, cfg: Config) -> Path:
    from operators.parquet_sink import ParquetSink

    run_dir = run_dir.resolve()
    if ParquetSink(run_dir / "experiences").committed_steps():
        raise InputError("already holds committed steps; choose a new --run-dir", file=str(run_dir))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return run_dir


@dataclass
class Totals:
    """Running totals over committed steps, for the progress bar and the closing summary."""

    started: float = field(default_factory=time.monotonic)
    experiences: int = 0
    rewards: float = 0.0
    tokens: int = 0
    failed: int = 0

    def add(self, experiences: pa.Table, metrics: dict[str, float]) -> None:
        self.experiences += len(experiences)
        self.rewards += pc.sum(experiences.column("reward")).as_py() or 0.0
        self.tokens += pc.sum(pc.list_value_length(experiences.column("response_ids"))).as_py() or 0
        self.failed += int(metrics["rollout/failed_tasks"])

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(time.monotonic() - self.started, 1e-9)


def stream_steps(cfg: Config, plan, engine_names: list[str], sink, monitor, progress: bool) -> Totals:
    """Drive the dataflow; commit, log and report each step once it and every earlier one are complete."""
    from tqdm import tqdm

    from pipelines.control import StepCommitter
    from pipelines.dataflow import rollout_dataset
    from pipelines.metrics import sample_table, step_metrics

    committer = StepCommitter(plan, sink)
    totals = Totals()
    bar = tqdm(total=plan.total_tasks, unit="task", desc="explore", disable=not progress, dynamic_ncols=True)
    dataset = rollout_dataset(cfg, plan, engine_names, sink.root)
    for records in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
        bar.update(len(records))
        for done in committer.add(records):
            metrics = step_metrics(done.experiences, done.records, done.seconds)
            monitor.log_metrics(metrics, done.step)
            if cfg.monitor.sample_rollouts and len(done.experiences):
                sample = sample_table(done.experiences, cfg.monitor.sample_rollouts)
                monitor.log_table(sample, f"samples/step_{done.step:06d}.json")
            totals.add(done.experiences, metrics)
            for message in failure_messages(done.records):
                bar.write(f"step {done.step}: task failed: {message}", file=sys.stderr)
            reward = metrics.get("rollout/reward/mean", float("nan"))
            bar.set_postfix(
                step=f"{done.step}/{plan.num_steps}",
                tok_s=f"{totals.tokens_per_s:.0f}",
                reward=f"{reward:.2f}",
            )
    bar.close()
    if not committer.done:
        raise RuntimeError(f"the stream ended before step {committer.next_step} was complete")
    return totals


def explore(
    cfg: Config,
    run_dir: Path,
    *,
    ray_address: str | None = None,
    mlflow_uri: str | None = None,
    progress: bool = True,
    engines: EngineSet | None = None,
    verbose: bool = False,
) -> Summary:
    """One explore run: validate input, start engines, stream steps, commit and log each, summarise.

    `engines` lets a caller (a benchmark, a test) reuse warm engine actors; they are then left running.
    Input errors surface before any engine starts; a failed run keeps its committed steps and nothing else.
    """
    from operators.parquet_sink import ParquetSink
    from operators.taskset_reader import plan_taskset
    from pipelines.monitor import MlflowMonitor, default_tracking_uri
    from pipelines.runtime import check_model_dir, init_ray, launch_engines, stop_engines, wait_engines

    buffer = cfg.buffer
    plan = plan_taskset(
        buffer.explorer_input.taskset, buffer.batch_size, buffer.total_epochs, buffer.total_steps
    )
    check_model_dir(cfg.model.model_path)
    run_dir = prepare_run_dir(run_dir, cfg)
    sink = ParquetSink(run_dir / "experiences")
    tracking_uri = mlflow_uri or cfg.monitor.mlflow_uri or default_tracking_uri(run_dir)
    owned = None
    monitor = None
    try:
        init_ray(cfg.ray, ray_address, verbose)
        if engines is None:
            engines = owned = launch_engines(cfg, run_dir.name)
        # The tracking store is set up while the engines load their model.
        experiment = cfg.monitor.experiment or cfg.project
        monitor = MlflowMonitor(tracking_uri, experiment, run_dir.name, run_dir / "mlartifacts")
        monitor.log_params(flatten(cfg))
        wait_engines(engines)
        totals = stream_steps(cfg, plan, engines.names, sink, monitor, progress)
        monitor.close(ok=True)
    except BaseException:
        if monitor is not None:
            monitor.close(ok=False)
        raise
    finally:
        stop_engines(owned)
        sink.discard_pending()  # uncommitted fragments are never experiences
    seconds = time.monotonic() - totals.started
    return Summary(
        steps=plan.num_steps,
        experiences=totals.experiences,
        failed_tasks=totals.failed,
        mean_reward=totals.rewards / totals.experiences if totals.experiences else float("nan"),
        tokens_per_s=totals.tokens / seconds,
        seconds=seconds,
        run_dir=run_dir,
        tracking_uri=tracking_uri,
        mlflow_run_id=monitor.run_id,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    try:
        cfg = build_config(args)
        run_dir = args.run_dir or Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        summary = explore(
            cfg,
            run_dir,
            ray_address=args.ray_address,
            mlflow_uri=args.mlflow_uri,
            progress=not args.no_progress,
            verbose=args.verbose,
        )
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
