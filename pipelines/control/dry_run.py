"""`--dry-run`: every check made before an engine starts, then the resolved config, and nothing started or
written.

The config is printed as YAML with each value left at its default marked `# default`, so what the user (or
the Trinity-RFT translation) set stands out; what the translation ignored or changed is logged above it, one
notice per key.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from pyarrow.fs import FileType

from operators.sinks.base import Sink, open_sink
from operators.sinks.sql import SqlSink
from pipelines.control.checks import check_inputs, check_local_defaults, check_run_dir
from pipelines.control.metrics import skipped_rows
from pipelines.control.resume_check import check_resume
from pipelines.control.state import resume_state
from schemas.config import Config
from schemas.run_end import finished_step
from schemas.storage import Location, display, file_type


def marked_config(cfg: Config) -> str:
    """The config as YAML, each leaf at its default value marked."""
    lines: list[str] = []
    walk(cfg.public_dump(), Config().model_dump(mode="json"), 0, lines)
    return "\n".join(lines)


def walk(values: dict[str, Any], defaults: Any, depth: int, lines: list[str]) -> None:
    indent = "  " * depth
    for key, value in values.items():
        default = defaults.get(key) if isinstance(defaults, dict) else None
        if isinstance(value, dict) and value:
            lines.append(f"{indent}{key}:")
            walk(value, default, depth + 1, lines)
            continue
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
        mark = "  # default" if isinstance(defaults, dict) and key in defaults and value == default else ""
        lines.append(f"{indent}{key}: {text}{mark}")


def explore_dry_run(cfg: Config, run_dir: Location | None, mlflow_uri: str | None = None) -> str:
    """The explore command's checks (config, tasksets, model, plugins and names; the run dir and the sink,
    also when the run dir is not there yet; the resume checks on an existing run dir), as a report;
    InputError on the first that fails."""
    inputs = check_inputs(cfg)
    said = ["dry run: every check before an engine starts passed; nothing was started or written."]
    for name, (count, reasons) in skipped_rows(cfg, inputs.plan, inputs.eval_plans).items():
        said.append(f"taskset '{name}': a run would skip {count} bad rows, e.g. {reasons}")
    place = run_dir if run_dir is not None else default_run_dir(cfg.name)
    check_run_dir(place)
    check_local_defaults(cfg, place, mlflow_uri)
    sink = open_sink(cfg.buffer.trainer_input.experience_buffer, place)  # refuses an in-memory SQLite
    try:
        check_store(sink)
        if file_type(place) != FileType.NotFound:
            check_resume(cfg, place)
            state = resume_state(place, sink)
            said.append(resume_plan(state.latest_step, inputs.plan.num_steps, place))
        elif run_dir is not None:
            said.append(f"a run would start afresh in {display(run_dir)} (not there yet).")
    finally:
        sink.close()
    return "\n".join([marked_config(cfg), "", *said])


def default_run_dir(name: str) -> Path:
    """Where a run without --run-dir would write (`runs/<name>-<timestamp>`)."""
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_store(sink: Sink) -> None:
    """A database the run would write to answers, as the run finds out before its engines start; a SQLite file
    not made yet is not opened (opening would make it)."""
    if not isinstance(sink, SqlSink):
        return
    if sink.url.get_backend_name() == "sqlite" and not Path(sink.url.database).is_file():
        return
    sink.committed_steps()  # InputError, its URL masked, when the store cannot be reached


def resume_plan(latest_step: int, num_steps: int, run_dir: Location) -> str:
    if latest_step >= num_steps:
        done = f"{display(run_dir)} has committed all its {num_steps} steps: no steps are left"
        if finished_step(run_dir) is None:  # a crash after its last commit (`Explorer.prepare`)
            return f"{done}; a run would start the engines only for the eval or sync its last step missed."
        return f"{done}, and a run would start nothing (raise buffer.total_steps, or --steps, to go on)."
    if latest_step:
        return f"a run would resume {display(run_dir)} after its committed step {latest_step}."
    return f"a run would start afresh in {display(run_dir)}."
