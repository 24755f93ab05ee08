"""`--dry-run`: every check made before an engine starts, then the resolved config, and nothing started or
written.

The config is printed as YAML with each value left at its default marked `# default`, so what the user (or
the Trinity-RFT translation) set stands out; what the translation ignored or changed is logged above it, one
notice per key.
"""

from __future__ import annotations

from typing import Any

import yaml
from pyarrow.fs import FileType

from operators.sinks.base import open_sink
from pipelines.control.checks import check_inputs, check_local_defaults, check_run_dir
from pipelines.control.resume_check import check_resume
from pipelines.control.state import resume_state
from schemas.config import Config
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
    """The explore command's checks (config, tasksets, model, plugins and names; the resume checks on an
    existing run dir), as a report; InputError on the first that fails."""
    check_inputs(cfg)
    said = ["dry run: every check before an engine starts passed; nothing was started or written."]
    if run_dir is not None:
        check_run_dir(run_dir)
        check_local_defaults(cfg, run_dir, mlflow_uri)
    if run_dir is not None and file_type(run_dir) != FileType.NotFound:
        check_resume(cfg, run_dir)
        state = resume_state(run_dir, open_sink(cfg.buffer.trainer_input.experience_buffer, run_dir))
        if state.latest_step:
            said.append(
                f"a run would resume {display(run_dir)} after its committed step {state.latest_step}."
            )
        else:
            said.append(f"a run would start afresh in {display(run_dir)}.")
    elif run_dir is not None:
        said.append(f"a run would start afresh in {display(run_dir)} (not there yet).")
    return "\n".join([marked_config(cfg), "", *said])
