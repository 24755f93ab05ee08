"""`python -m pipelines.bench`: benchmark a list of checkpoints on the eval tasksets, tracked in MLflow.

The engines start once, with the config's model; each checkpoint is then loaded in place (the same reload a
weight sync uses), so a benchmark of N checkpoints pays one engine start, not N. Every checkpoint is checked
before any engine sees it, and a bad one is reported and skipped while the others go on.

Results are kept in `<run dir>/bench_state.json`, keyed by the weights' sha256, the taskset and the sampling
settings, so a rerun (or a `--watch` that restarts) skips what it has already measured. `Explorer.benchmark()`
runs through `run_benchmark` here too.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from operators.engine.checkpoints import (
    STEP_DIR,
    CheckpointError,
    TensorMetaMap,
    check_checkpoint,
    find_checkpoints,
    weight_files,
)
from operators.rollout.plugins import PluginError
from operators.tasks.reader import TasksetPlan, list_files, plan_taskset
from pipelines.benchmark.report import table_rows, write_outputs
from pipelines.control.runtime import EngineSet
from pipelines.explore import add_config_arguments
from schemas.config import DEFAULT_EVAL, Config, TasksetConfig, flatten, load_config
from schemas.errors import InputError

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

STATE_FILE = "bench_state.json"
WATCH_POLL_S = 2.0
DEFAULT_TIMEOUT_S = 3600.0
HASH_CHUNK = 1 << 20
# what a result carries, each with `_ci_low`/`_ci_high` except the last three
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed")
TRAILING_NUMBER = re.compile(r"(?:^|[-_])(\d+)$")


# -- choosing checkpoints ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One model directory to benchmark, with the step its metrics are logged at."""

    path: Path
    step: int
    is_base: bool = False
    root: Path | None = None  # the --checkpoint-dir it was found in; a path the user named has none

    @property
    def label(self) -> str:
        return "base" if self.is_base else self.path.name


def checkpoint_step(path: Path, position: int) -> int:
    """`global_step_N` → N; a trailing number (`checkpoint-500`) → that number; else the 1-based position."""
    name = Path(path).name
    match = STEP_DIR.match(name) or TRAILING_NUMBER.search(name)
    return int(match.group(1)) if match else position


def select_candidates(
    checkpoints: Iterable[Path] = (),
    checkpoint_dir: Path | None = None,
    base: Path | None = None,
    latest_only: bool = False,
) -> list[Candidate]:
    """The checkpoints to run, by ascending step: the base (step 0) first, then the listed and found ones.

    Paths given in any order are sorted by their step; a path named twice is run once. With `latest_only`
    only the highest step is kept (and the base, when asked for).
    """
    found: list[Candidate] = []
    for position, path in enumerate(checkpoints, start=1):
        found.append(Candidate(Path(path), checkpoint_step(Path(path), position)))
    if checkpoint_dir is not None:
        found.extend(
            Candidate(path, step, root=Path(checkpoint_dir))
            for step, path in find_checkpoints(checkpoint_dir)
        )
    seen: set[str] = set()
    unique = []
    for candidate in sorted(found, key=lambda c: c.step):  # stable: ties keep the order given
        key = str(candidate.path.resolve())
        if key not in seen and (base is None or key != str(Path(base).resolve())):
            seen.add(key)
            unique.append(candidate)
    if latest_only and unique:
        unique = [c for c in unique if c.step == unique[-1].step][-1:]
    return ([Candidate(Path(base), 0, is_base=True)] if base is not None else []) + unique


# -- identities: weights, tasksets, sampling -----------------------------------------------------------------


def weights_hash(directory: Path, cache: dict[str, Any] | None = None) -> str:
    """sha256 over the safetensors files' names and bytes (streamed), cached by each file's size and mtime.

    Identical weights in two directories get one hash, so a copy already benchmarked is not run again.
    """
    files = weight_files(directory)
    stamp = []
    for path in files:
        stat = path.stat()
        stamp.append([path.name, stat.st_size, stat.st_mtime_ns])
    key = str(Path(directory).resolve())
    if cache is not None and cache.get(key, {}).get("files") == stamp:
        return cache[key]["sha256"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(HASH_CHUNK):
                digest.update(chunk)
    value = digest.hexdigest()
    if cache is not None:
        cache[key] = {"files": stamp, "sha256": value}
    return value


def sampling_of(taskset: TasksetConfig) -> dict[str, Any]:
    """The settings that change what is sampled: a result measured under others is not reused."""
    args = taskset.rollout_args.model_dump(mode="json")
    return {**{k: args[k] for k in SAMPLING_FIELDS}, "repeat_times": taskset.repeat_times}


def taskset_key(taskset: TasksetConfig, workflow: str) -> str:
    """Name, settings, workflow and the taskset files' bytes: a changed taskset is measured again."""
    digest = hashlib.sha256()
    settings = taskset.model_dump(mode="json")
    settings.pop("path")
    digest.update(json.dumps([settings, workflow], sort_keys=True).encode())
    for path in list_files(taskset.path):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def check_architecture(directory: Path, base: Path) -> None:
    """Same `model_type` and `architectures` as the engine's model: the tensor checks alone miss a renamed
    architecture with the same tensors."""
    try:
        mine = json.loads((Path(directory) / "config.json").read_text())
        theirs = json.loads((Path(base) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{directory}: unreadable config.json ({exc})") from None
    for key in ("model_type", "architectures"):
        if mine.get(key) != theirs.get(key):
            raise CheckpointError(
                f"{directory}: incompatible architecture: {key} is {mine.get(key)!r}, "
                f"the engine runs {theirs.get(key)!r}"
            )


def check_candidate(candidate: Candidate, expected: TensorMetaMap, base: Path) -> None:
    """Raise CheckpointError naming why this directory cannot be loaded into the engines."""
    path = candidate.path
    if not path.exists():
        raise CheckpointError(f"{path}: not found")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    check_checkpoint(path, expected, root=candidate.root)  # config.json, whole files, the model's tensors
    check_architecture(path, base)


# -- metrics -------------------------------------------------------------------------------------------------


def result_metrics(experiences: Any, seconds: float, failed_tasks: int) -> dict[str, float]:
    """Estimates with intervals from eval experiences (a `pa.Table`), plus tokens/s and task counts."""
    import pyarrow.compute as pc

    from pipelines.benchmark.stats import task_estimates

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
    """`bench/<taskset>/<metric>`, with k written out (`mean_at_4`): MLflow refuses '@' in names."""
    return {f"bench/{taskset}/{name.replace('_at_k', f'_at_{k}')}": v for name, v in metrics.items()}


# -- state ---------------------------------------------------------------------------------------------------


@dataclass
class BenchState:
    """What a run dir has measured: one record per (weights, taskset, sampling), the parent run, hashes."""

    parent_run_id: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    hash_cache: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> BenchState:
        path = Path(run_dir) / STATE_FILE
        if not path.is_file():
            return cls()
        raw = json.loads(path.read_text())
        return cls(raw.get("parent_run_id"), raw.get("records", []), raw.get("hash_cache", {}))

    def save(self, run_dir: Path) -> None:
        """Written aside and renamed: a crash leaves the previous state, never half of one."""
        path = Path(run_dir) / STATE_FILE
        partial = path.with_suffix(".json.partial")
        data = {"parent_run_id": self.parent_run_id, "records": self.records, "hash_cache": self.hash_cache}
        partial.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(partial, path)

    def find(self, weights: str, key: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r["weights_hash"] == weights and r["key"] == key), None)

    def put(self, record: dict[str, Any]) -> None:
        self.records = [
            r
            for r in self.records
            if not (r["weights_hash"] == record["weights_hash"] and r["key"] == record["key"])
        ]
        self.records.append(record)

    def child_of(self, path: Path, weights: str) -> str | None:
        """The child run already holding this checkpoint's results, to add a new taskset to it."""
        for r in self.records:
            if r["weights_hash"] == weights and r["checkpoint"] == str(path):
                return r.get("child_run_id")
        return None


# -- MLflow --------------------------------------------------------------------------------------------------


class ParentRun:
    """The benchmark's MLflow run; each checkpoint gets a child run nested under it (`mlflow.parentRunId`)."""

    def __init__(self, client: Any, run_id: str):
        self.client, self.run_id = client, run_id
        self.experiment_id = client.get_run(run_id).info.experiment_id

    def log_metrics(self, metrics: dict[str, float], step: int, run_id: str | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if math.isfinite(v)]
        self.client.log_batch(run_id or self.run_id, metrics=batch)

    def child(self, candidate: Candidate, weights: str, reuse: str | None) -> str:
        if reuse is not None:
            with contextlib.suppress(Exception):  # deleted meanwhile: a new child is made below
                self.client.update_run(reuse, status="RUNNING")
                return reuse
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"step_{candidate.step}-{candidate.label}",
            tags={"mlflow.parentRunId": self.run_id, "rftflow.bench.weights_hash": weights},
        )
        return run.info.run_id

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in sorted(params.items())]
        for start in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[start : start + 100])


def child_params(
    candidate: Candidate, weights: str, tasksets: list[TasksetConfig], existing: dict[str, str]
) -> dict[str, Any]:
    """Checkpoint path, step, weights hash and each taskset's sampling; only keys the run lacks (MLflow
    refuses to change a logged param)."""
    params: dict[str, Any] = {
        "checkpoint": str(candidate.path.resolve()),
        "step": candidate.step,
        "weights_hash": weights,
    }
    for ts in tasksets:
        params[f"taskset.{ts.name}.path"] = str(Path(ts.path).resolve())
        params.update({f"sampling.{ts.name}.{k}": v for k, v in sampling_of(ts).items()})
    return {k: v for k, v in params.items() if k not in existing}


# -- table and plot ------------------------------------------------------------------------------------------


@dataclass
class Failure:
    candidate: Candidate
    reason: str


# -- the benchmark -------------------------------------------------------------------------------------------


@dataclass
class Selection:
    """Which checkpoints: listed paths, a `global_step_N` folder, the base; optionally watched."""

    checkpoints: list[Path] = field(default_factory=list)
    checkpoint_dir: Path | None = None
    include_base: bool = False
    latest_only: bool = False
    watch: bool = False
    timeout: float = DEFAULT_TIMEOUT_S


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


@dataclass
class Bench:
    """Runs candidates one after another on warm engines: check, hash, skip or reload in place, evaluate."""

    cfg: Config
    run_dir: Path
    engines: EngineSet | None  # None: started by `start_engines` when a checkpoint first needs them
    parent: ParentRun
    state: BenchState
    plans: dict[str, TasksetPlan]
    expected: TensorMetaMap
    force: bool = False
    say: Callable[[str], None] = print
    loaded_hash: str | None = None  # the weights the engines hold now, when known
    report: BenchReport = field(default_factory=BenchReport)
    done_paths: set[str] = field(default_factory=set)
    keys: dict[str, str] = field(default_factory=dict)
    reloads: int = 0  # in-place loads made: shared engines need putting back only when this is not 0
    start_engines: Callable[[], EngineSet] | None = None

    def ensure_engines(self) -> EngineSet:
        """Start the engines on first need, so a rerun with nothing new to measure starts none."""
        if self.engines is None:
            self.engines = self.start_engines()
            self.loaded_hash = weights_hash(self.base, self.state.hash_cache)  # they start on the base
        return self.engines

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
            check_candidate(candidate, self.expected, self.base)
            weights = weights_hash(candidate.path, self.state.hash_cache)
        except CheckpointError as exc:
            self._fail(candidate, str(exc))
            return "failed"
        todo = [ts for ts in self.tasksets if self.force or self.state.find(weights, self.key(ts)) is None]
        if not todo:
            self.report.skipped.append(candidate)
            self._succeeded(candidate)
            return "skipped"
        try:
            self.ensure_engines()
        except Exception as exc:  # noqa: BLE001 - reported for this checkpoint; the next one tries again
            self._fail(candidate, f"engines did not start: {type(exc).__name__}: {str(exc)[-300:]}")
            return "failed"
        if weights != self.loaded_hash:
            error = self._load(candidate)
            if error:
                self._fail(candidate, error)
                return "failed"
            self.loaded_hash = weights
        reuse = None if self.force else self.state.child_of(candidate.path, weights)
        child = self.parent.child(candidate, weights, reuse)
        existing = self.parent.client.get_run(child).data.params
        self.parent.log_params(child, child_params(candidate, weights, self.tasksets, existing))
        status = "FINISHED"
        try:
            for taskset in todo:
                self._evaluate(candidate, weights, taskset, child)
        except Exception as exc:  # noqa: BLE001 - one bad checkpoint must not stop the others
            status = "FAILED"
            self._fail(candidate, f"eval failed: {type(exc).__name__}: {str(exc).splitlines()[-1][:300]}")
            return "failed"
        finally:
            self.parent.client.set_terminated(child, status=status)
        self.report.evaluated.append(candidate)
        self._succeeded(candidate)
        return "done"

    def _load(self, candidate: Candidate) -> str:
        """Reload every engine in place from `candidate`; an error message, or '' when all loaded."""
        from pipelines.control.weight_sync import gather

        self.reloads += 1
        timeout = self.cfg.synchronizer.sync_timeout
        path = str(candidate.path.resolve())
        calls = [h.load_checkpoint.remote(path, candidate.step, timeout) for h in self.engines.handles]
        _, errors = gather(calls, timeout)
        if errors:
            self.loaded_hash = None  # engines may hold a mix now; the next load replaces every weight
            return "load failed: " + "; ".join(errors)
        return ""

    def _evaluate(self, candidate: Candidate, weights: str, taskset: TasksetConfig, child: str) -> None:
        """One eval taskset whole on the loaded weights; metrics to the child and parent, record saved."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from pipelines.control.plan import eval_dataset
        from schemas.status import flatten_experiences

        started = time.monotonic()
        plan = self.plans[taskset.name]
        dataset = eval_dataset(self.cfg, taskset, plan, self.engines.names, candidate.step)
        results = list(dataset.iter_batches(batch_format="pyarrow", batch_size=None))
        seconds = time.monotonic() - started
        table = pa.concat_tables(results) if results else None
        if table is None or not len(table):
            raise RuntimeError(f"taskset '{taskset.name}' gave no results")
        experiences = flatten_experiences(table)
        failed = len(table) - (pc.sum(table.column("ok")).as_py() or 0)
        if not len(experiences):
            messages = table.filter(pc.invert(table.column("ok"))).column("message").to_pylist()[:1]
            raise RuntimeError(f"taskset '{taskset.name}': every task failed, e.g. {messages}")
        out = self.run_dir / "bench" / f"step_{candidate.step}-{weights[:12]}"
        out.mkdir(parents=True, exist_ok=True)
        pq.write_table(experiences, out / f"{taskset.name}.parquet")
        metrics = result_metrics(experiences, seconds, failed)
        self._keep(candidate, weights, taskset, child, metrics, seconds)
        self.say(
            f"step {candidate.step} ({candidate.label}) {taskset.name}: accuracy {metrics['accuracy']:.3f} "
            f"[{metrics['accuracy_ci_low']:.3f}, {metrics['accuracy_ci_high']:.3f}], "
            f"{metrics['tokens_per_s']:.0f} tok/s"
        )

    def _keep(
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

    def _succeeded(self, candidate: Candidate) -> None:
        """Done with this path; a failure it had while being written (watch mode) no longer stands."""
        self.done_paths.add(str(candidate.path.resolve()))
        self.report.failures = [f for f in self.report.failures if f.candidate.path != candidate.path]

    def _fail(self, candidate: Candidate, reason: str) -> None:
        self.report.failures = [f for f in self.report.failures if f.candidate.path != candidate.path]
        self.report.failures.append(Failure(candidate, reason))

    def restore(self, version: int, path: Path) -> None:
        """Put shared engines back on the weights their owner expects (e.g. an Explorer's current version)."""
        from pipelines.control.weight_sync import gather

        timeout = self.cfg.synchronizer.sync_timeout
        calls = [
            h.load_checkpoint.remote(str(Path(path).resolve()), version, timeout)
            for h in self.engines.handles
        ]
        _, errors = gather(calls, timeout)
        if errors:
            raise RuntimeError(f"could not put the engines back on version {version}: {'; '.join(errors)}")


def run_benchmark(
    bench: Bench,
    selection: Selection,
    *,
    progress: bool = True,
    restore: tuple[int, Path] | None = None,
) -> BenchReport:
    """Every selected checkpoint (and new ones, when watching), then the table, plot and artifacts.

    `restore`: the (version, directory) the engines must hold afterwards, when they outlive the benchmark.
    """
    from tqdm import tqdm

    started = time.monotonic()
    base = bench.base if selection.include_base else None
    candidates = select_candidates(
        selection.checkpoints, selection.checkpoint_dir, base, selection.latest_only
    )
    bar = tqdm(total=len(candidates), unit="ckpt", desc="bench", disable=not progress, dynamic_ncols=True)
    say = bench.say
    bench.say = lambda line: bar.write(line, file=sys.stderr) if progress else say(line)
    announced = {str(c.path) for c in candidates}
    told: set[tuple[Path, str]] = set()

    def tell_failure(candidate: Candidate) -> None:
        for failure in bench.report.failures:
            if failure.candidate.path == candidate.path and (candidate.path, failure.reason) not in told:
                told.add((candidate.path, failure.reason))
                retry = " (retried until --timeout)" if selection.watch else ""
                bench.say(f"step {candidate.step} ({candidate.label}) failed{retry}: {failure.reason}")

    try:
        for candidate in candidates:
            status = bench.run_one(candidate)
            tell_failure(candidate)
            bar.update(1)
            bar.set_postfix(last=f"{candidate.label}: {status}")
        deadline = started + selection.timeout
        while selection.watch and time.monotonic() < deadline:
            fresh = [
                c
                for c in select_candidates((), selection.checkpoint_dir, None, selection.latest_only)
                if str(c.path.resolve()) not in bench.done_paths
            ]
            progressed = False
            for candidate in fresh:  # a checkpoint still being written fails its check and is retried
                if str(candidate.path) not in announced:
                    announced.add(str(candidate.path))
                    bar.total += 1
                status = bench.run_one(candidate)
                tell_failure(candidate)
                if status != "failed":
                    progressed = True
                    bar.update(1)
                    bar.set_postfix(last=f"{candidate.label}: {status}")
            if not progressed and trainer_stopped(selection.checkpoint_dir):
                break  # the trainer writes no more, and what is left keeps failing
            time.sleep(WATCH_POLL_S)
    finally:
        bar.close()
        bench.say = say
        if restore is not None and bench.reloads and bench.engines is not None:
            bench.restore(*restore)
    report = bench.report
    report.rows = table_rows(bench.state.records, report.failures)
    report.outputs = write_outputs(report.rows, bench.run_dir)
    for path in report.outputs.values():
        bench.parent.client.log_artifact(bench.parent.run_id, str(path))
    report.parent_run_id = bench.parent.run_id
    report.seconds = time.monotonic() - started
    return report


def trainer_stopped(checkpoint_dir: Path | None) -> bool:
    """A trainer that says it has stopped writes no more checkpoints: watching can end early."""
    from pipelines.control.sync_policy import read_trainer_status

    if checkpoint_dir is None:
        return False
    return read_trainer_status(str(Path(checkpoint_dir) / "trainer_status.json")).state == "stopped"


# -- inputs --------------------------------------------------------------------------------------------------


def resolve_tasksets(cfg: Config, paths: list[Path]) -> list[TasksetConfig]:
    """`--taskset` files (named by their stem, read with the training taskset's format and sampling), else
    the config's eval tasksets, else the bundled arithmetic eval set."""
    explorer_input = cfg.buffer.explorer_input
    if not paths and explorer_input.eval_tasksets:
        return list(explorer_input.eval_tasksets)
    paths = paths or [DEFAULT_EVAL]
    names = [Path(p).stem if p != DEFAULT_EVAL else "arith_eval" for p in paths]
    if len(set(names)) != len(names):
        raise InputError(
            f"two tasksets share a name: {names} (names come from the file stems)", field="--taskset"
        )
    return [
        explorer_input.taskset.model_copy(update={"name": n, "path": Path(p)})
        for n, p in zip(names, paths, strict=True)
    ]


def prepare_inputs(cfg: Config, taskset_paths: list[Path]) -> tuple[dict[str, TasksetPlan], TensorMetaMap]:
    """Check everything before an engine starts: tasksets (file, row, field), model, workflows."""
    from pipelines.control.explorer import base_tensor_meta, check_workflows
    from pipelines.control.runtime import check_model_dir

    cfg.buffer.explorer_input.eval_tasksets = resolve_tasksets(cfg, taskset_paths)
    plans = {
        ts.name: plan_taskset(ts, cfg.buffer.batch_size, 1, None)
        for ts in cfg.buffer.explorer_input.eval_tasksets
    }
    check_model_dir(cfg.model.model_path)
    expected = base_tensor_meta(cfg.model.model_path)
    check_workflows(cfg)
    return plans, expected


def open_parent(cfg: Config, run_dir: Path, tracking_uri: str, state: BenchState, params: dict[str, Any]):
    """The CLI's parent run: new, or the one this run dir's state names (a rerun continues it)."""
    from pipelines.control.tracking import MlflowMonitor

    experiment = cfg.monitor.experiment or cfg.project
    monitor = MlflowMonitor(
        tracking_uri, experiment, run_dir.name, run_dir / "mlartifacts", state.parent_run_id
    )
    if state.parent_run_id is None:
        monitor.log_params(params)
        state.parent_run_id = monitor.run_id
        state.save(run_dir)
    return monitor


def benchmark(
    cfg: Config,
    run_dir: Path,
    selection: Selection,
    *,
    taskset_paths: list[Path] | None = None,
    force: bool = False,
    ray_address: str | None = None,
    mlflow_uri: str | None = None,
    progress: bool = True,
    engines: EngineSet | None = None,
) -> tuple[BenchReport, str]:
    """The CLI's whole run; returns the report and the tracking URI.

    `engines` lets a caller (a test, a benchmark script) reuse warm engine actors; they are put back on the
    base model's weights (version 0) afterwards and left running. Otherwise engines start when a checkpoint
    first needs them (a rerun with nothing new starts none) and stop at the end.
    """
    from pipelines.control.runtime import init_ray, launch_engines, stop_engines, wait_engines
    from pipelines.control.tracking import default_tracking_uri

    run_dir = Path(run_dir).resolve()
    plans, expected = prepare_inputs(cfg, list(taskset_paths or []))
    if (
        selection.checkpoint_dir is not None
        and not Path(selection.checkpoint_dir).is_dir()
        and not selection.watch
    ):
        raise InputError(
            "checkpoint directory not found", file=str(selection.checkpoint_dir), field="--checkpoint-dir"
        )
    if not (selection.checkpoints or selection.checkpoint_dir or selection.include_base):
        raise InputError("nothing to benchmark: give --checkpoints, --checkpoint-dir or --include-base")
    run_dir.mkdir(parents=True, exist_ok=True)
    state = BenchState.load(run_dir)
    tracking_uri = mlflow_uri or cfg.monitor.mlflow_uri or default_tracking_uri(run_dir)
    init_ray(cfg.ray, ray_address)
    owned: list[EngineSet] = []

    def start() -> EngineSet:
        owned.append(launch_engines(cfg, run_dir.name))
        wait_engines(owned[-1])
        return owned[-1]

    monitor = None
    ok = False
    try:
        params = {**flatten(cfg), **{f"bench.{k}": v for k, v in vars(selection).items()}}
        monitor = open_parent(cfg, run_dir, tracking_uri, state, params)
        bench = Bench(
            cfg,
            run_dir,
            engines,
            ParentRun(monitor.client, monitor.run_id),
            state,
            plans,
            expected,
            force=force,
            say=lambda line: print(line, file=sys.stderr),
            start_engines=start,
        )
        restore = None if engines is None else (0, Path(cfg.model.model_path))
        report = run_benchmark(bench, selection, progress=progress, restore=restore)
        ok = report.ok
        return report, tracking_uri
    finally:
        for started in owned:
            stop_engines(started)
        if monitor is not None:
            monitor.close(ok)


def explorer_selection(cfg: Config, checkpoint_dir: Path) -> Selection:
    """The reference's choice, except that with both flags set the base *and* the newest are benchmarked."""
    return Selection(
        checkpoint_dir=checkpoint_dir,
        include_base=cfg.explorer.eval_on_startup,
        latest_only=cfg.explorer.bench_on_latest_checkpoint,
    )


def explorer_benchmark(explorer: Any) -> bool:
    """`Explorer.benchmark()`: its checkpoint dir, with `bench_on_latest_checkpoint` and `eval_on_startup`.

    After `prepare()` the child runs nest under the explorer's own MLflow run and the engines go back to the
    version the run has reached; without it, engines start here and a parent run of its own is made.
    """
    from pipelines.control.runtime import init_ray, launch_engines, wait_engines

    cfg = explorer.config.model_copy(deep=True)  # the bench's eval tasksets must not become the explorer's
    run_dir = explorer.run_dir
    plans, expected = prepare_inputs(cfg, [])
    selection = explorer_selection(cfg, explorer.checkpoint_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = BenchState.load(run_dir)
    init_ray(cfg.ray, explorer.ray_address, explorer.verbose)
    shared = explorer.engines is not None

    def start() -> EngineSet:
        explorer.engines = explorer.owned = launch_engines(cfg, explorer.name)  # shutdown() stops them
        wait_engines(explorer.engines)
        return explorer.engines

    own_monitor = None
    if explorer.monitor is not None:
        parent = ParentRun(explorer.monitor.client, explorer.monitor.run_id)
        version = explorer.state.model_version
        on_disk = explorer.syncer.on_disk if explorer.syncer is not None else (0, Path(cfg.model.model_path))
        restore = on_disk if on_disk is not None and on_disk[0] == version else None
        if restore is None:
            explorer._say(
                f"version {version} is not on disk: the engines stay on the last benchmarked weights"
            )
    else:
        params = {**flatten(cfg), **{f"bench.{k}": v for k, v in vars(selection).items()}}
        own_monitor = open_parent(cfg, run_dir, explorer.tracking_uri, state, params)
        parent = ParentRun(own_monitor.client, own_monitor.run_id)
        restore = (0, Path(cfg.model.model_path)) if shared else None
    ok = False
    try:
        bench = Bench(
            cfg,
            run_dir,
            explorer.engines,
            parent,
            state,
            plans,
            expected,
            say=explorer._say,
            start_engines=start,
        )
        report = run_benchmark(bench, selection, progress=False, restore=restore)
        ok = report.ok
        for failure in report.failures:
            explorer._say(f"benchmark: {failure.candidate.path}: {failure.reason}")
        return ok
    finally:
        if own_monitor is not None:
            own_monitor.close(ok)


# -- CLI -----------------------------------------------------------------------------------------------------


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
        type=Path,
        help="where outputs go (default: runs/bench-<timestamp>); an existing one is resumed",
    )
    parser.add_argument(
        "--checkpoints",
        nargs="+",
        type=Path,
        default=[],
        metavar="PATH",
        help="Hugging Face model directories, in any order (run by their step: global_step_N, a trailing "
        "number, else their position)",
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR", help="every global_step_N under DIR, by N"
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
        type=Path,
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
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. for log files)")
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


def main(argv: list[str] | None = None, engines: EngineSet | None = None) -> int:
    """0: every checkpoint measured (or already measured); 1: some failed; 2: bad input, nothing run."""
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        run_dir = args.run_dir or Path("runs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
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
    except (InputError, PluginError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.render(tracking_uri))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
