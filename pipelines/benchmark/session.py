"""A whole benchmark: inputs checked, the MLflow parent run, the fleet, the loop, and the engines afterwards.

Two callers: `python -m pipelines.bench` (its own parent run; engines it starts stop at the end) and
`Explorer.benchmark()` (child runs under the explorer's run when it has one; the fleet is the explorer's, and
goes back to the run's version afterwards).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from operators.engine.checkpoints import CheckpointError
from operators.tasks.reader import TasksetPlan
from pipelines.benchmark.loop import Bench, BenchReport, run_benchmark
from pipelines.benchmark.selection import Selection, check_candidate, select_candidates
from pipelines.benchmark.state import BenchState
from pipelines.control.checks import check_inputs, check_run_dir
from pipelines.control.dry_run import marked_config
from pipelines.control.fleet import EngineFleet, Restore
from pipelines.control.runtime import init_ray
from pipelines.control.tracking import MlflowMonitor, default_tracking_uri
from schemas.config import DEFAULT_EVAL, Config, TasksetConfig, flatten
from schemas.errors import InputError
from schemas.run_dir import MLARTIFACTS

log = logging.getLogger(__name__)


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


def prepare_inputs(cfg: Config, taskset_paths: list[Path]) -> tuple[dict[str, TasksetPlan], Any]:
    """Check everything before an engine starts: tasksets (file, row, field), model, workflows."""
    cfg.buffer.explorer_input.eval_tasksets = resolve_tasksets(cfg, taskset_paths)
    inputs = check_inputs(cfg, train=False)
    return inputs.eval_plans, inputs.expected


def open_parent(
    cfg: Config, run_dir: Path, tracking_uri: str, state: BenchState, params: dict[str, Any]
) -> MlflowMonitor:
    """The benchmark's own parent run: new, or the one this run dir's state names (a rerun continues it)."""
    experiment = cfg.monitor.experiment or cfg.project
    monitor = MlflowMonitor(
        tracking_uri, experiment, run_dir.name, run_dir / MLARTIFACTS, state.parent_run_id
    )
    if state.parent_run_id is None:
        monitor.log_params(params)
        state.parent_run_id = monitor.run_id
        state.save(run_dir)
    return monitor


def starter(fleet: EngineFleet, cfg: Config) -> Any:
    """Start `fleet` on first need, watched with the config's health settings."""

    def start() -> EngineFleet:
        if not fleet.started:
            fleet.start()
        fleet.watch(cfg.explorer)
        return fleet

    return start


def check_bench_inputs(
    cfg: Config, run_dir: Path, selection: Selection, taskset_paths: list[Path] | None
) -> tuple[dict[str, TasksetPlan], Any]:
    """Everything checked before an engine starts (the eval plans and the model's tensors), or InputError."""
    check_run_dir(Path(run_dir))
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
    return plans, expected


def bench_dry_run(cfg: Config, run_dir: Path, selection: Selection, taskset_paths: list[Path] | None) -> str:
    """`--dry-run`: the bench's checks before an engine starts, and each checkpoint's own check, as a report;
    InputError on bad input. Nothing is started or written."""
    plans, expected = check_bench_inputs(cfg, run_dir, selection, taskset_paths)
    base = Path(cfg.model.model_path) if selection.include_base else None
    lines = [marked_config(cfg), "", f"dry run: eval tasksets {', '.join(plans)}; checkpoints:"]
    for candidate in select_candidates(
        selection.checkpoints, selection.checkpoint_dir, base, selection.latest_only
    ):
        try:
            if not candidate.is_base:
                check_candidate(candidate, expected, Path(cfg.model.model_path), cfg.model.lora)
            verdict = "would be measured"
        except CheckpointError as exc:
            verdict = f"would fail: {exc}"
        lines.append(f"  {candidate.label}: {verdict}")
    lines.append("nothing was started or written.")
    return "\n".join(lines)


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
    engines: EngineFleet | None = None,
) -> tuple[BenchReport, str]:
    """The CLI's whole run; returns the report and the tracking URI.

    `engines` lets a caller (a test, a benchmark script) reuse a started fleet; it is put back on the base
    model's weights (version 0) afterwards and left running. Otherwise engines start when a checkpoint
    first needs them (a rerun with nothing new starts none) and stop at the end.
    """
    plans, expected = check_bench_inputs(cfg, run_dir, selection, taskset_paths)
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    state = BenchState.load(run_dir)
    tracking_uri = mlflow_uri or cfg.monitor.mlflow_uri or default_tracking_uri(run_dir)
    init_ray(cfg.ray, ray_address)
    fleet = engines or EngineFleet(cfg, run_dir.name)
    monitor = None
    ok = False
    try:
        params = {**flatten(cfg), **{f"bench.{k}": v for k, v in vars(selection).items()}}
        monitor = open_parent(cfg, run_dir, tracking_uri, state, params)
        bench = Bench(
            cfg,
            run_dir,
            engines,
            monitor,
            state,
            plans,
            expected,
            force=force,
            start_fleet=starter(fleet, cfg),
        )
        restore = None if engines is None else Restore(0, path=Path(cfg.model.model_path).resolve())
        report = run_benchmark(bench, selection, progress=progress, restore=restore)
        ok = report.ok
        return report, tracking_uri
    finally:
        if engines is None:
            fleet.stop()
        if monitor is not None:
            monitor.close(ok)


def explorer_selection(cfg: Config, checkpoint_dir: Path) -> Selection:
    """The reference's choice, except that with both flags set the base *and* the newest are benchmarked."""
    return Selection(
        checkpoint_dir=checkpoint_dir,
        include_base=cfg.explorer.eval_on_startup,
        latest_only=cfg.explorer.bench_on_latest_checkpoint,
    )


def benchmark_for_explorer(
    config: Config,
    run_dir: Path,
    fleet: EngineFleet,
    checkpoint_dir: Path,
    monitor: MlflowMonitor | None,
    tracking_uri: str,
) -> bool:
    """`Explorer.benchmark()`: its checkpoint dir, with `bench_on_latest_checkpoint` and `eval_on_startup`.

    With the explorer's MLflow run (`monitor`, after `prepare()`), child runs nest under it and the fleet
    goes back to the restore point it had; without, a parent run of its own is made. True when no checkpoint
    failed.
    """
    cfg = config.model_copy(deep=True)  # the bench's eval tasksets must not become the explorer's
    plans, expected = prepare_inputs(cfg, [])
    selection = explorer_selection(cfg, checkpoint_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = BenchState.load(run_dir)
    shared = fleet.started
    own_monitor = None
    restore = fleet.restore_point if shared else None
    if monitor is not None:
        parent = monitor
        if restore is not None and not restore.loadable:
            log.warning(
                "version %d came by broadcast: the engines stay on the last benchmarked weights",
                restore.version,
            )
            restore = None
    else:
        params = {**flatten(cfg), **{f"bench.{k}": v for k, v in vars(selection).items()}}
        own_monitor = parent = open_parent(cfg, run_dir, tracking_uri, state, params)
    ok = False
    try:
        bench = Bench(
            cfg,
            run_dir,
            fleet if shared else None,
            parent,
            state,
            plans,
            expected,
            start_fleet=starter(fleet, cfg),
        )
        report = run_benchmark(bench, selection, progress=False, restore=restore)
        ok = report.ok
        for failure in report.failures:
            log.warning("benchmark: %s: %s", failure.candidate.path, failure.reason)
        return ok
    finally:
        if own_monitor is not None:
            own_monitor.close(ok)
