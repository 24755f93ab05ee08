"""The explorer's YAML configuration (pydantic). Field names follow Trinity-RFT where the meaning is the same.

Unknown keys and wrong types are refused with the key's full dotted path. The `buffer` section lives in
`schemas.buffer_config`, the engine's in `schemas.engine_config`, and reading a file with its `--set`
overrides in `schemas.config_loading`; every name a user imports is importable from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from schemas.buffer_config import (
    DEFAULT_EVAL,
    DEFAULT_TRAIN,
    SQL_NAME,
    SQL_NAME_MAX,
    BufferConfig,
    ExperienceBufferConfig,
    ExplorerInput,
    FormatConfig,
    ReasoningGymConfig,
    RolloutArgs,
    TasksetConfig,
    TrainerInput,
)
from schemas.config_base import ASSETS, MAX_SECONDS, GivenPath, Strict
from schemas.config_loading import parse_override, read_tree, validated
from schemas.engine_config import RolloutModelConfig
from schemas.interpolation import hide_env
from schemas.lora_config import LoraConfig
from schemas.rollout_policy import DynamicTimeoutConfig, OverRolloutConfig
from schemas.secrets import mask_tree
from schemas.serve_config import ServeConfig

# The names users import from here, wherever each is defined: the sections, the defaults and the loading.
__all__ = [
    "ASSETS",
    "DEFAULT_EVAL",
    "DEFAULT_MODEL",
    "DEFAULT_TRAIN",
    "SQL_NAME",
    "SQL_NAME_MAX",
    "FC_MODEL",
    "TOOL_MODEL",
    "BufferConfig",
    "Config",
    "ExperienceBufferConfig",
    "ExplorerConfig",
    "ExplorerInput",
    "FormatConfig",
    "LoraConfig",
    "ModelConfig",
    "MonitorConfig",
    "RayConfig",
    "ReasoningGymConfig",
    "RolloutArgs",
    "Strict",
    "SynchronizerConfig",
    "TasksetConfig",
    "TrainerInput",
    "flatten",
    "load_config",
    "parse_override",
    "validate_tree",
]

DEFAULT_MODEL = ASSETS / "tiny-arith-llama"
TOOL_MODEL = ASSETS / "tiny-tool-llama"  # the tiny model also taught the `tool_math` calculator
FC_MODEL = ASSETS / "tiny-fc-llama"  # the tool model, calling the calculator by function calling (hermes)


class ModelConfig(Strict):
    model_path: GivenPath = Field(
        DEFAULT_MODEL,
        description="a Hugging Face model directory (safetensors, tokenizer, chat template)",
        json_schema_extra={"doc_default": "bundled `tiny-arith-llama`"},
    )
    lora: LoraConfig | None = Field(
        None,
        description="sample under a LoRA adapter that the trainer updates (null: the whole model); its keys "
        "below, as when it is given",
        json_schema_extra={"doc_expand": True},
    )


class ExplorerConfig(Strict):
    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset(
        {
            "runner_per_model",
            "max_timeout",
            "max_retry_times",
            "batch_timeout",
            "eval_interval",
            "eval_on_startup",
            "bench_on_latest_checkpoint",
            "health_check_interval",
            "health_check_timeout",
            "max_engine_restarts",
            "engine_restart_timeout",
            "over_rollout",
            "dynamic_timeout",
        }
    )

    rollout_model: RolloutModelConfig = RolloutModelConfig()
    runner_per_model: int = Field(4, ge=1, le=1024, description="task batches in flight per engine")
    max_timeout: float = Field(
        900.0,
        gt=0.0,
        le=MAX_SECONDS,
        description="seconds per task attempt; a timed-out attempt is cancelled",
    )
    max_retry_times: int = Field(
        2, ge=0, le=100, description="retries after an exception, a timeout or a malformed experience"
    )
    max_repeat_times_per_runner: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="split a task's repeats into sub-runs of at most this many, each with its own status "
        "(null: no split)",
    )
    batch_timeout: float | None = Field(
        None,
        gt=0.0,
        le=MAX_SECONDS,
        description="seconds per rollout batch; unfinished sub-runs are cancelled and reported as failed",
    )
    eval_interval: int = Field(100, ge=1, description="evaluate every N steps (when `eval_tasksets` are set)")
    eval_on_startup: bool = Field(
        True,
        description="also evaluate at step 0 when `eval_tasksets` are set (and `benchmark()` includes the "
        "base model)",
    )
    bench_on_latest_checkpoint: bool = Field(
        False,
        description="`benchmark()`: only the newest checkpoint in `checkpoint_dir` (plus the base model when "
        "`eval_on_startup`)",
    )
    health_check_interval: float | None = Field(
        5.0,
        gt=0.0,
        le=MAX_SECONDS,
        description="seconds between engine health checks (null: no checks, no restarts; see Failures and "
        "recovery)",
    )
    health_check_timeout: float = Field(
        60.0,
        gt=0.0,
        le=MAX_SECONDS,
        description="an engine that does not answer a check within this many seconds is replaced",
    )
    max_engine_restarts: int = Field(
        3, ge=0, le=1000, description="replacements per engine before the run stops with a message"
    )
    engine_restart_timeout: float = Field(
        600.0,
        gt=0.0,
        le=MAX_SECONDS,
        description="seconds a replacement may take to start and load the current version (and the "
        "engines, at a run's start, to load the version it resumes from); a request to a lost engine waits "
        "this long for it",
    )
    over_rollout: OverRolloutConfig = OverRolloutConfig()
    dynamic_timeout: DynamicTimeoutConfig = DynamicTimeoutConfig()


class SynchronizerConfig(Strict):
    """When and from where the explorer takes the trainer's newest weights (docs/DESIGN.md: weight sync)."""

    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset(
        {"sync_timeout", "trainer_status", "partial_rollout"}
    )

    sync_method: Literal["none", "checkpoint", "broadcast", "memory"] = Field(
        "none",
        description="weight source: `none` (fixed weights), `checkpoint` (`global_step_N/` dirs in "
        "`checkpoint_dir`), `broadcast` (torch.distributed from the trainer) or `memory` (a state dict "
        "through the Ray object store); see Weight sync",
    )
    checkpoint_dir: GivenPath | None = Field(
        None,
        description="`checkpoint`: where the trainer writes `global_step_N/` "
        "(default `<run dir>/checkpoints`)",
    )
    max_staleness: int | None = Field(
        None,
        ge=0,
        description="drop experiences more than this many versions behind the trainer's newest when their "
        "step commits (null: keep all)",
    )
    sync_style: Literal["fixed", "dynamic_by_explorer", "dynamic_by_trainer"] = Field(
        "fixed", description="`fixed`, `dynamic_by_explorer` or `dynamic_by_trainer` (see Steps and syncs)"
    )
    sync_interval: int = Field(1, ge=1, description="steps per period")
    sync_offset: int = Field(0, ge=0, description="steps explored before the first sync")
    partial_rollout: bool = Field(
        False,
        description="a sync cuts the generations in flight instead of waiting for them; each keeps its "
        "tokens and logprobs and goes on under the new weights, every token stamped with its version "
        "(`token_versions`; staleness counts the oldest). The `mask_old_tokens` experience op keeps the "
        "older tokens out of training",
    )
    sync_timeout: float = Field(
        1200.0,
        gt=0.0,
        le=MAX_SECONDS,
        description="seconds a sync waits for a newer version (then it goes on with the old weights), and "
        "the limit on each load",
    )
    trainer_status: str | None = Field(
        None,
        description="the trainer's status: a JSON file, or `actor:<name>` of a named actor with "
        "`get_status()`. Default: `<checkpoint_dir>/trainer_status.json` for `checkpoint`, the weight hub "
        "for `memory`/`broadcast`",
    )


class MonitorConfig(Strict):
    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset({"mlflow_uri", "experiment", "sample_rollouts"})

    mlflow_uri: str | None = Field(
        None,
        description="tracking URI: a tracking server `http://host:5000` (artifacts go to its store) or a "
        "database (default `sqlite:///<absolute run dir>/mlflow.db`)",
    )
    experiment: str | None = Field(None, description="MLflow experiment (default: `project`)")
    sample_rollouts: int = Field(8, ge=0, description="rollouts per step kept in the MLflow samples table")


class RayConfig(Strict):
    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset({"address", "num_cpus", "object_store_memory_mib"})

    address: str | None = Field(None, description="Ray cluster to join (`--ray-address` overrides it)")
    num_cpus: int | None = Field(
        None, ge=1, le=65536, description="logical CPUs of a local Ray (default: max(4, cores))"
    )
    object_store_memory_mib: int = Field(
        512,
        ge=64,
        le=2**24,
        description="object store size of a local Ray; for `memory` sync give it at least twice the model's "
        "bytes",
    )


class Config(Strict):
    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset({"project", "monitor", "ray", "mode"})

    mode: Literal["explore", "bench", "serve"] = Field(
        "explore",
        description="`explore` runs the explorer; `bench` benchmarks the checkpoints in "
        "`synchronizer.checkpoint_dir` instead (Trinity-RFT's mode of the same name); `serve` serves live "
        "traffic and commits what is rewarded (`serve`, `python -m pipelines.serve`)",
    )
    project: str = Field("rftflow", description="MLflow experiment name, unless `monitor.experiment` is set")
    name: str = Field("explore", description="run name; the default run dir is `runs/<name>-<timestamp>`")
    plugin_dirs: list[GivenPath] = Field(
        [],
        description="folders of workflow/reward modules, loaded in every worker (`--plugin-dir` adds to it)",
    )
    model: ModelConfig = ModelConfig()
    buffer: BufferConfig = BufferConfig()
    explorer: ExplorerConfig = ExplorerConfig()
    synchronizer: SynchronizerConfig = SynchronizerConfig()
    monitor: MonitorConfig = MonitorConfig()
    ray: RayConfig = RayConfig()
    serve: ServeConfig = ServeConfig()
    # NAME -> value of each environment variable the config file's `${oc.env:NAME}` read: written back as the
    # reference, never as the value, wherever the config is shown or saved (`public_dump`)
    _env: dict[str, str] = PrivateAttr(default_factory=dict)

    def remember_env(self, values: dict[str, str]) -> Config:
        self._env = dict(values)
        return self

    @property
    def env_values(self) -> dict[str, str]:
        return dict(self._env)

    def public_dump(self) -> dict[str, Any]:
        """The config as JSON values, with each value read from the environment put back as its
        `${oc.env:NAME}` reference (it may be a secret), and URL passwords and secret-named keys masked
        (`schemas.secrets`): for config.yaml, MLflow params and --dry-run."""
        return mask_tree(hide_env(self.model_dump(mode="json"), self._env))

    @model_validator(mode="after")
    def _adapters_cached(self) -> Config:
        # Versions a step may still commit stay loaded, plus the one loading: vLLM's CPU cache holds them.
        lora, staleness = self.model.lora, self.synchronizer.max_staleness
        if lora is not None and lora.max_cpu_loras < lora.kept_versions(staleness) + 1:
            problem = (
                f"model.lora.max_cpu_loras ({lora.max_cpu_loras}) must be at least "
                f"synchronizer.max_staleness + 2 ({lora.kept_versions(staleness) + 1})"
            )
            loc = ("model", "lora", "max_cpu_loras")
            error = InitErrorDetails(
                type=PydanticCustomError("lora_cache", problem), loc=loc, input=lora.max_cpu_loras
            )
            raise ValidationError.from_exception_data("Config", [error])
        if lora is not None and self.explorer.rollout_model.dtype not in ("float32", "float"):
            # the delivery probe holds the engine's float32 scores to 1e-3; in bfloat16 (what `auto` picks
            # for a float32 model on CPU) they are ~0.7 off and the base model is barely further
            problem = "a LoRA run's delivery probe needs float32 engines: set it to float32"
            loc = ("explorer", "rollout_model", "dtype")
            dtype = self.explorer.rollout_model.dtype
            raise ValidationError.from_exception_data(
                "Config",
                [InitErrorDetails(type=PydanticCustomError("lora_dtype", problem), loc=loc, input=dtype)],
            )
        if lora is not None and self.synchronizer.sync_method == "broadcast":
            error = InitErrorDetails(
                type=PydanticCustomError("lora_sync", "a LoRA run syncs by `checkpoint` or `memory`"),
                loc=("synchronizer", "sync_method"),
                input="broadcast",
            )
            raise ValidationError.from_exception_data("Config", [error])
        return self

    @model_validator(mode="after")
    def _room_for_a_prompt(self) -> Config:
        # vLLM refuses each request whose max_tokens leaves no room for its prompt, but only once it runs.
        rollout, inputs = self.explorer.rollout_model, self.buffer.explorer_input
        prompt = rollout.max_prompt_tokens
        limit = f"explorer.rollout_model.max_model_len ({rollout.max_model_len}): lower one, or raise it"
        training = inputs.training_tasksets
        where_train = [("tasksets", i) for i in range(len(training))] if inputs.tasksets else [("taskset",)]
        wheres = [*where_train, *(("eval_tasksets", i) for i in range(len(inputs.eval_tasksets)))]
        for where, taskset in zip(wheres, [*training, *inputs.eval_tasksets], strict=True):
            loc = ("buffer", "explorer_input", *where, "rollout_args", "max_tokens")
            key, tokens = ".".join(map(str, loc)), taskset.rollout_args.max_tokens
            if tokens >= rollout.max_model_len:
                problem = f"{key} ({tokens}) leaves no room for a prompt in {limit}"
            elif prompt is not None and prompt + tokens > rollout.max_model_len:
                problem = (
                    f"explorer.rollout_model.max_prompt_tokens ({prompt}) + {key} ({tokens}) is over {limit}"
                )
            else:
                continue
            error = InitErrorDetails(type=PydanticCustomError("no_room", problem), loc=loc, input=tokens)
            raise ValidationError.from_exception_data("Config", [error])
        return self


def validate_tree(tree: dict[str, Any], source: str) -> Config:
    """The config a tree of plain values makes; the first refusal is named by its dotted key."""
    return validated(Config, tree, source)


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read YAML (optional; a Trinity-RFT config is translated, see `schemas.trinity`; in rftflow's own,
    `${oc.env:NAME,default}` is resolved, see `schemas.interpolation`, and relative paths are the file's
    folder's, see `schemas.config_paths`), apply `--set` overrides (paths there: the working directory's),
    validate; errors name the file and the key path (`schemas.config_loading`)."""
    tree, env = read_tree(path, overrides)
    return validate_tree(tree, str(path) if path else "--set").remember_env(env)


def flatten(config: Config) -> dict[str, str]:
    """Dotted key → value, for MLflow params."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = str(value)

    walk("", config.public_dump())
    return out
