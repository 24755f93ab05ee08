"""The checkpoint-benchmark loop: for each checkpoint, check, hash, skip or load in place, evaluate, record.

The engines start once; each checkpoint is loaded through the fleet (the same in-place reload a weight sync
uses), so N checkpoints cost one engine start, and an engine replaced mid-benchmark comes back on the
checkpoint under test. A bad checkpoint is reported with its reason and the others go on. With `model.lora`,
the checkpoints are adapters of the config's model, each loaded as the adapter version of its step (vLLM
keeps the base weights; the engines never restart).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from operators.engine.checkpoints import CheckpointError, TensorMetaMap, weights_hash
from operators.tasks.reader import TasksetPlan
from pipelines.benchmark.identity import sampling_of, taskset_key
from pipelines.benchmark.report import table_rows, write_outputs
from pipelines.benchmark.selection import (
    Candidate,
    Failure,
    Selection,
    check_candidate,
    path_problem,
    resolved,
    select_candidates,
    trainer_stopped,
)
from pipelines.benchmark.state import BenchState
from pipelines.benchmark.stats import task_estimates
from pipelines.control.adapter_sync import checkpoint_update
from pipelines.control.evaluate import Evaluation, evaluate
from pipelines.control.fleet import Fleet, LoadError, Restore, WeightUpdate
from pipelines.control.tracking import MlflowMonitor
from schemas.config import Config, TasksetConfig
from schemas.run_dir import BENCH, bench_dir_name

log = logging.getLogger(__name__)
WATCH_POLL_S = 2.0


def result_metrics(experiences: pa.Table, seconds: float, failed_tasks: int) -> dict[str, float]:
    """Estimates with intervals from eval experiences, plus tokens/s and task counts."""
    lengths = pc.list_value_length(experiences.column("response_ids")).to_pylist()
    rewards = experiences.column("reward").to_pylist()
    parts = experiences.column("reward_parts").to_pylist()
    # the eval workflows' accuracy: the reward's `accuracy` part, else the reward itself
    accuracy = [dict(p or []).get("accuracy", r) for p, r in zip(parts, rewards, strict=True)]
    task_ids = experiences.column("task_uid").to_pylist()
    out: dict[str, float] = {}
    for name, estimate in task_estimates(task_ids, accuracy, lengths).items():
        out.update({name: estimate.value, f"{name}_ci_low": estimate.low, f"{name}_ci_high": estimate.high})
    out["tokens_per_s"] = sum(lengths) / seconds if seconds > 0 else 0.0
    out["failed_tasks"] = float(failed_tasks)
    out["num_tasks"] = float(len(set(task_ids)) + failed_tasks)
    return out


def mlflow_metrics(taskset: str, k: int, metrics: dict[str, float]) -> dict[str, float]:
    """`bench/<taskset>/<metric>`, with k written out (`mean_at_4`): MLflow refuses '@' in names. Only
    finite values: an interval over too few tasks may have none."""
    named = {f"bench/{taskset}/{name.replace('_at_k', f'_at_{k}')}": v for name, v in metrics.items()}
    return {k: v for k, v in named.items() if math.isfinite(v)}


def child_params(
    candidate: Candidate, weights: str, tasksets: list[TasksetConfig], existing: dict[str, str]
) -> dict[str, Any]:
    """Checkpoint path, step, weights hash and each taskset's sampling; only keys the run lacks (MLflow
    refuses to change a logged param)."""
    params: dict[str, Any] = {
        "checkpoint": resolved(candidate.path),
        "step": candidate.step,
        "weights_hash": weights,
    }
    for ts in tasksets:
        params[f"taskset.{ts.name}.path"] = str(Path(ts.path).resolve())
        params.update({f"sampling.{ts.name}.{k}": v for k, v in sampling_of(ts).items()})
    return {k: v for k, v in params.items() if k not in existing}


@dataclass
class BenchReport:
    evaluated: list[Candidate] = field(default_factory=list)
    skipped: list[Candidate] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, Path] = field(default_factory=dict)
    parent_run_id: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def render(self, tracking_uri: str) -> str:
        lines = [
            f"rftflow bench finished: {len(self.evaluated)} checkpoints evaluated, {len(self.skipped)} "
            f"already done, {len(self.failures)} failed ({self.seconds:.1f} s)",
        ]
        for row in self.rows:
            if row["status"] == "ok":
                lines.append(
                    f"  step {row['step']:>6} {Path(row['checkpoint']).name:<24} {row['taskset']:<12} "
                    f"accuracy {row['accuracy']:.3f} [{row['accuracy_ci_low']:.3f}, "
                    f"{row['accuracy_ci_high']:.3f}]  pass@{row['k']} {row['pass_at_k']:.3f}  "
                    f"{row['tokens_per_s']:.0f} tok/s"
                )
        lines += [
            f"  FAILED step {f.candidate.step} ({f.candidate.label}): {f.reason}" for f in self.failures
        ]
        lines += [f"  {name + ':':<7} {path}" for name, path in self.outputs.items()]
        lines.append(f"  mlflow: {tracking_uri} (parent run {self.parent_run_id})")
        return "\n".join(lines)


Evaluate = Callable[[Config, Fleet, TasksetConfig, TasksetPlan, int, Path], Evaluation]


@dataclass
class Bench:
    """Runs candidates one after another on warm engines: check, hash, skip or reload in place, evaluate."""

    cfg: Config
    run_dir: Path
    fleet: Fleet | None  # None: started by `start_fleet` when a checkpoint first needs it
    parent: MlflowMonitor
    state: BenchState
    plans: dict[str, TasksetPlan]
    expected: TensorMetaMap
    force: bool = False
    start_fleet: Callable[[], Fleet] | None = None
    evaluate: Evaluate = evaluate
    loaded_hash: str | None = None  # the weights the engines hold now, when known
    report: BenchReport = field(default_factory=BenchReport)
    done_paths: set[str] = field(default_factory=set)
    keys: dict[str, str] = field(default_factory=dict)
    reloads: int = 0  # in-place loads made: shared engines need putting back only when this is not 0

    def ensure_fleet(self) -> Fleet:
        """Start the engines on first need, so a rerun with nothing new to measure starts none."""
        if self.fleet is None:
            self.fleet = self.start_fleet()
            self.loaded_hash = weights_hash(self.base, self.state.hash_cache)  # they start on the base
        return self.fleet

    @property
    def tasksets(self) -> list[TasksetConfig]:
        return list(self.cfg.buffer.explorer_input.eval_tasksets)

    @property
    def base(self) -> Path:
        return Path(self.cfg.model.model_path)

    def key(self, taskset: TasksetConfig) -> str:
        if taskset.name not in self.keys:
            workflow = self.cfg.buffer.explorer_input.workflow_for(taskset, is_eval=True)
            self.keys[taskset.name] = taskset_key(taskset, workflow)
        return self.keys[taskset.name]

    def run_one(self, candidate: Candidate) -> str:
        """`done`, `skipped` or `failed`; a failure is recorded with its reason and never raised."""
        try:
            check_candidate(candidate, self.expected, self.base, self.cfg.model.lora)
            weights = weights_hash(candidate.path, self.state.hash_cache)
        except CheckpointError as exc:
            return self.fail(candidate, str(exc))
        except (OSError, RuntimeError) as exc:  # gone or looping since its check (a trainer deleting it)
            return self.fail(candidate, f"{candidate.path}: {path_problem(exc)}")
        todo = [ts for ts in self.tasksets if self.force or self.state.find(weights, self.key(ts)) is None]
        if not todo:
            self.report.skipped.append(candidate)
            self.succeeded(candidate)
            return "skipped"
        try:
            self.ensure_fleet()
        except Exception as exc:  # noqa: BLE001 - reported for this checkpoint; the next one tries again
            return self.fail(candidate, f"engines did not start: {type(exc).__name__}: {str(exc)[-300:]}")
        if weights != self.loaded_hash:
            try:
                self.load(candidate)
            except (LoadError, CheckpointError) as exc:
                self.loaded_hash = None  # the next load replaces every weight, whatever is there now
                return self.fail(candidate, f"load failed: {exc}")
            self.loaded_hash = weights
        reuse = None if self.force else self.state.child_of(candidate.path, weights)
        child = self.parent.child(
            f"step_{candidate.step}-{candidate.label}", {"rftflow.bench.weights_hash": weights}, reuse
        )
        params = child_params(candidate, weights, self.tasksets, self.parent.params(child))
        self.parent.log_params(params, child)
        ok = False
        try:
            for taskset in todo:
                self.measure(candidate, weights, taskset, child)
            ok = True
        except Exception as exc:  # noqa: BLE001 - one bad checkpoint must not stop the others
            message = str(exc).splitlines()[-1][:300] if str(exc) else ""
            return self.fail(candidate, f"eval failed: {type(exc).__name__}: {message}")
        finally:
            self.parent.end_child(child, ok)
        self.report.evaluated.append(candidate)
        self.succeeded(candidate)
        return "done"

    def load(self, candidate: Candidate) -> None:
        """Every engine loads `candidate` in place, through the fleet (which moves its restore point); in a
        LoRA run, as the adapter version of its step, proven by its probe (computed here when it has none)."""
        self.reloads += 1
        path = candidate.path.resolve()
        if self.cfg.model.lora is not None and not candidate.is_base:
            update = checkpoint_update(self.cfg, path, candidate.step)
        else:
            update = WeightUpdate(candidate.step, "checkpoint", path=path)
        self.fleet.load(update, self.cfg.synchronizer.sync_timeout)

    def measure(self, candidate: Candidate, weights: str, taskset: TasksetConfig, child: str) -> None:
        """One eval taskset whole on the loaded weights; metrics to the child and parent, record saved."""
        out = self.run_dir / BENCH / bench_dir_name(candidate.step, weights) / f"{taskset.name}.parquet"
        result = self.evaluate(self.cfg, self.fleet, taskset, self.plans[taskset.name], candidate.step, out)
        if result.records is None or not len(result.records):
            raise RuntimeError(f"taskset '{taskset.name}' gave no results")
        if not len(result.experiences):
            raise RuntimeError(f"taskset '{taskset.name}': every task failed, e.g. {result.first_failure()}")
        metrics = result_metrics(result.experiences, result.seconds, result.failed_tasks)
        self.keep(candidate, weights, taskset, child, metrics, result.seconds)
        log.info(
            "step %d (%s) %s: accuracy %.3f [%.3f, %.3f], %.0f tok/s",
            candidate.step,
            candidate.label,
            taskset.name,
            metrics["accuracy"],
            metrics["accuracy_ci_low"],
            metrics["accuracy_ci_high"],
            metrics["tokens_per_s"],
        )

    def keep(
        self,
        candidate: Candidate,
        weights: str,
        taskset: TasksetConfig,
        child: str,
        metrics: dict[str, float],
        seconds: float,
    ) -> None:
        """Log a result to the child and the parent (step = checkpoint step) and record it for resume."""
        named = mlflow_metrics(taskset.name, taskset.repeat_times, metrics)
        self.parent.log_metrics(named, candidate.step, child)
        self.parent.log_metrics(named, candidate.step)
        self.state.put(
            {
                "checkpoint": str(candidate.path),
                "step": candidate.step,
                "weights_hash": weights,
                "taskset": taskset.name,
                "key": self.key(taskset),
                "k": taskset.repeat_times,
                "sampling": sampling_of(taskset),
                "metrics": metrics,
                "child_run_id": child,
                "seconds": seconds,
            }
        )
        self.state.save(self.run_dir)

    def succeeded(self, candidate: Candidate) -> None:
        """Done with this path; a failure it had while being written (watch mode) no longer stands."""
        self.done_paths.add(resolved(candidate.path))
        self.report.failures = [f for f in self.report.failures if f.candidate.path != candidate.path]

    def fail(self, candidate: Candidate, reason: str) -> str:
        self.report.failures = [f for f in self.report.failures if f.candidate.path != candidate.path]
        self.report.failures.append(Failure(candidate, reason))
        return "failed"

    def restore(self, point: Restore) -> None:
        """Put shared engines back on the weights their owner expects (e.g. an Explorer's current version)."""
        try:
            self.fleet.load(point.as_update(), self.cfg.synchronizer.sync_timeout)
        except LoadError as exc:
            raise RuntimeError(f"could not put the engines back on version {point.version}: {exc}") from None


def run_benchmark(
    bench: Bench, selection: Selection, *, progress: bool = True, restore: Restore | None = None
) -> BenchReport:
    """Every selected checkpoint (and new ones, when watching), then the table, plot and artifacts.

    `restore`: the weights the engines must hold afterwards, when they outlive the benchmark.
    """
    started = time.monotonic()
    base = bench.base if selection.include_base else None
    candidates = select_candidates(
        selection.checkpoints, selection.checkpoint_dir, base, selection.latest_only
    )
    bar = tqdm(total=len(candidates), unit="ckpt", desc="bench", disable=not progress, dynamic_ncols=True)
    announced = {str(c.path) for c in candidates}
    told: set[tuple[Path, str]] = set()

    def run(candidate: Candidate) -> str:
        status = bench.run_one(candidate)
        for failure in bench.report.failures:
            if failure.candidate.path == candidate.path and (candidate.path, failure.reason) not in told:
                told.add((candidate.path, failure.reason))
                retry = " (retried until --timeout)" if selection.watch else ""
                log.warning(
                    "step %d (%s) failed%s: %s", candidate.step, candidate.label, retry, failure.reason
                )
        if status != "failed" or not selection.watch:
            bar.update(1)
            bar.set_postfix(last=f"{candidate.label}: {status}")
        return status

    try:
        for candidate in candidates:
            run(candidate)
        deadline = started + selection.timeout
        while selection.watch and time.monotonic() < deadline:
            fresh = [
                c
                for c in select_candidates((), selection.checkpoint_dir, None, selection.latest_only)
                if resolved(c.path) not in bench.done_paths
            ]
            progressed = False
            for candidate in fresh:  # a checkpoint still being written fails its check and is retried
                if str(candidate.path) not in announced:
                    announced.add(str(candidate.path))
                    bar.total += 1
                progressed |= run(candidate) != "failed"
            if not progressed and trainer_stopped(selection.checkpoint_dir):
                break  # the trainer writes no more, and what is left keeps failing
            time.sleep(WATCH_POLL_S)
    finally:
        bar.close()
        if restore is not None and bench.reloads and bench.fleet is not None:
            bench.restore(restore)
    report = bench.report
    report.rows = table_rows(bench.state.records, report.failures)
    report.outputs = write_outputs(report.rows, bench.run_dir)
    for path in report.outputs.values():
        bench.parent.log_artifact(path)
    report.parent_run_id = bench.parent.run_id
    report.seconds = time.monotonic() - started
    return report
