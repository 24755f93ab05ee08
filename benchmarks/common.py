"""What the benchmark scripts share: the environment they run in, their common command-line options, the
config those options make, a taskset's first tasks, and starting engines (in process, or the explorer's
fleet). Each script still runs on its own, e.g. `python benchmarks/multi_turn.py --help`.

The project's heavier modules are imported inside the functions, as in the scripts, so `--help` answers at
once.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.cli import add_set_argument

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

# The options several scripts take, by their `args` name; each script gives its own defaults.
OPTIONS: dict[str, dict[str, Any]] = {
    "model": {"help": "model directory (default: the bundled tiny model)"},
    "tasks": {"type": int, "help": "tasks (prompts)"},
    "steps": {"type": int, "help": "steps"},
    "repeat": {"type": int, "help": "samples per task (repeat_times, vLLM n)"},
    "max_tokens": {"type": int, "help": "max sampled tokens per sample"},
    "batch_size": {"type": int, "help": "tasks per step"},
    "out": {"type": Path, "help": "also write the results here as JSON"},
}


def parser(doc: str | None, overrides: bool = True, **defaults: Any) -> argparse.ArgumentParser:
    """A script's parser: its docstring as the description, each shared option (`OPTIONS`) named in
    `defaults` at the default given there (a `(default, help)` pair also replaces the help), and with
    `overrides`, `--set KEY=VALUE` config overrides (`args.overrides`)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in defaults.items():
        option = dict(OPTIONS[name])
        if isinstance(default, tuple):
            default, option["help"] = default
        parser.add_argument("--" + name.replace("_", "-"), default=default, **option)
    if overrides:
        add_set_argument(parser)
    return parser


def bench_config(args: argparse.Namespace, *settings: str, plugin_dir: Path | None = None):
    """The config a script's options make: the batch size, the steps (`--steps`, else `--tasks` rounded up
    to whole steps of `--batch-size`), the samples per task, their max tokens and the model, as far as the
    script has those options; then the script's own `settings`; then `--set`, which overrides them all."""
    from schemas.config import load_config

    given = vars(args)
    overrides = []
    if "batch_size" in given:
        overrides.append(f"buffer.batch_size={args.batch_size}")
        steps = given["steps"] if "steps" in given else -(-args.tasks // args.batch_size)
        overrides.append(f"buffer.total_steps={steps}")
    if "repeat" in given:
        overrides.append(f"buffer.explorer_input.taskset.repeat_times={args.repeat}")
    if "max_tokens" in given:
        overrides.append(f"buffer.explorer_input.taskset.rollout_args.max_tokens={args.max_tokens}")
    if given.get("model"):
        overrides.append(f"model.model_path={args.model}")
    cfg = load_config(None, [*overrides, *settings, *given.get("overrides", [])])
    if plugin_dir is not None:
        cfg.plugin_dirs = [plugin_dir]
    return cfg


def first_tasks(cfg, count: int):
    """The first `count` tasks of the config's taskset, as the pipeline reads them."""
    from operators.tasks.reader import iter_task_tables, plan_taskset
    from schemas.task import tasks_from_table

    buffer = cfg.buffer
    plan = plan_taskset(
        buffer.explorer_input.taskset, buffer.batch_size, buffer.total_epochs, buffer.total_steps
    )
    tasks = []
    for table in iter_task_tables(buffer.explorer_input.taskset, plan, 0, 0):
        tasks.extend(tasks_from_table(table))
    return tasks[:count]


def in_process_engine(cfg):
    """An engine in this process (no Ray, no actor) on the config's model and rollout settings."""
    from operators.engine.actor import VLLMEngine

    return VLLMEngine(str(cfg.model.model_path), cfg.explorer.rollout_model.model_dump(mode="json"))


def start_fleet(cfg, name: str, launch: Callable[[str, bool], Any] | None = None):
    """The explorer's engines, started its way (`EngineFleet.start`: launch, then wait until ready) under
    `name`, on Ray as the config starts it (a no-op when Ray is up); `launch`: stand-ins for the engines."""
    from pipelines.control.fleet import EngineFleet
    from pipelines.control.runtime import init_ray

    init_ray(cfg.ray)
    return EngineFleet(cfg, name, launch=launch).start()
