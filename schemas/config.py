"""The explorer's YAML configuration (pydantic). Field names follow Trinity-RFT where the meaning is the same.

Unknown keys and wrong types are refused with the key's full dotted path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.errors import InputError

ASSETS = Path(__file__).resolve().parent.parent / "pipelines" / "assets"
DEFAULT_MODEL = ASSETS / "tiny-arith-llama"
DEFAULT_TRAIN = ASSETS / "tasksets" / "arith" / "train.jsonl"
DEFAULT_EVAL = ASSETS / "tasksets" / "arith" / "eval.jsonl"
# SQL table names: plain identifiers, short enough for PostgreSQL's 63 characters with "_steps" and an index.
SQL_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
SQL_NAME_MAX = 48


class Strict(BaseModel):
    # Numbers given for text fields (`--set name=2024`) are kept as text, as a user would expect.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)


class RolloutArgs(Strict):
    """Sampling settings for one taskset; `n` is taken from repeat_times."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    max_tokens: int = Field(16, ge=1)
    logprobs: int = Field(0, ge=0, description="extra top-k logprobs; the sampled token's is always kept")
    seed: int | None = Field(
        0, description="base sampling seed; each (task, run) derives its own. null: random"
    )


class FormatConfig(Strict):
    prompt_key: str = "prompt"
    response_key: str = "answer"
    messages_key: str | None = None


class TasksetConfig(Strict):
    name: str = "arith"
    path: Path = DEFAULT_TRAIN
    format: FormatConfig = FormatConfig()
    rollout_args: RolloutArgs = RolloutArgs()
    repeat_times: int = Field(4, ge=1)
    default_workflow_type: str | None = Field(
        None, description="workflow name (null: math for training, default_eval_workflow_type for eval)"
    )
    default_reward_fn_type: str | None = Field(None, description="reward function (null: the workflow's own)")
    workflow_args: dict[str, Any] = {}
    reward_fn_args: dict[str, Any] = {}
    on_bad_row: Literal["raise", "skip"] = Field(
        "raise", description="a row that cannot become a task: raise (name it, stop) or skip (count, report)"
    )
    # 16 MiB holds a million-token prompt (~4 bytes a token) four times over, yet bounds what one line costs;
    # 1 GiB keeps a row far inside Arrow's 2 GiB per string array.
    max_row_bytes: int = Field(
        16 * 2**20,
        ge=1,
        le=2**30,
        description="longest jsonl line (without its newline), or Parquet prompt/answer, in bytes; a longer "
        "one is a bad row",
    )


class ExplorerInput(Strict):
    taskset: TasksetConfig = TasksetConfig()
    eval_tasksets: list[TasksetConfig] = Field([], description="evaluated whole, on the same engines")
    default_eval_workflow_type: str = Field("eval_math", description="workflow for eval tasksets")

    def workflow_for(self, taskset: TasksetConfig, is_eval: bool) -> str:
        return taskset.default_workflow_type or (self.default_eval_workflow_type if is_eval else "math")


class ExperienceBufferConfig(Strict):
    """Where committed experiences go (Trinity-RFT's `trainer_input.experience_buffer`)."""

    storage_type: Literal["parquet", "sql"] = Field(
        "parquet", description="parquet: RUN_DIR/experiences/step_N/; sql: tables in a SQLAlchemy database"
    )
    path: str | None = Field(
        None, description="sql: a SQLAlchemy URL (default: sqlite:///<abs run dir>/experiences.db)"
    )
    name: str | None = Field(
        None,
        pattern=SQL_NAME,
        max_length=SQL_NAME_MAX,
        description="sql: the experience table (default: the run dir's name); its commit log is <name>_steps",
    )
    queue_capacity: int | None = Field(
        None, ge=1, description="also feed committed steps to a Ray queue of this many steps (null: no queue)"
    )
    queue_timeout: float = Field(
        600.0, gt=0.0, description="seconds a committed step may wait for room in a full queue (then: fail)"
    )

    @model_validator(mode="after")
    def _sql_only(self) -> ExperienceBufferConfig:
        if self.storage_type == "parquet" and (self.path is not None or self.name is not None):
            raise ValueError("path and name are for storage_type sql; Parquet goes under RUN_DIR/experiences")
        return self


class TrainerInput(Strict):
    experience_buffer: ExperienceBufferConfig = ExperienceBufferConfig()


class BufferConfig(Strict):
    batch_size: int = Field(8, ge=1, description="tasks per step")
    total_epochs: int = Field(1, ge=1)
    total_steps: int | None = Field(None, ge=1, description="stop after this many steps (null: all epochs)")
    explorer_input: ExplorerInput = ExplorerInput()
    trainer_input: TrainerInput = TrainerInput()


class ModelConfig(Strict):
    model_path: Path = DEFAULT_MODEL


class RolloutModelConfig(Strict):
    engine_num: int = Field(1, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    device: Literal["auto", "cpu", "gpu"] = "auto"
    dtype: str = "auto"
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0, description="GPU only")
    cpu_kvcache_space_gib: int = Field(1, ge=1, description="CPU only: KV cache size in GiB")
    max_model_len: int = Field(256, ge=16)
    enforce_eager: bool = True
    seed: int = 0
    engine_cpus: float = Field(1.0, gt=0.0, description="Ray CPUs reserved per engine actor")
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="longest prompt in tokens (null: what max_model_len leaves room for)"
    )
    prompt_overflow: Literal["refuse", "truncate"] = Field(
        "refuse",
        description="a longer prompt: refuse (the task fails with a message) or keep its last tokens",
    )

    @model_validator(mode="after")
    def _room_for_a_response(self) -> RolloutModelConfig:
        # Otherwise a prompt within the limit still fails in vLLM, and is retried as if it might pass.
        if self.max_prompt_tokens is not None and self.max_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"max_prompt_tokens ({self.max_prompt_tokens}) must be below max_model_len "
                f"({self.max_model_len}), which also holds the response"
            )
        return self


class ExplorerConfig(Strict):
    rollout_model: RolloutModelConfig = RolloutModelConfig()
    runner_per_model: int = Field(4, ge=1, description="rollout requests in flight per engine, in batches")
    max_timeout: float = Field(900.0, gt=0.0, description="seconds per task attempt")
    max_retry_times: int = Field(2, ge=0)
    max_repeat_times_per_runner: int | None = Field(
        None, ge=1, description="split a task's repeats into runs of at most this many (null: no split)"
    )
    batch_timeout: float | None = Field(
        None, gt=0.0, description="seconds for one rollout batch; unfinished tasks are cancelled and reported"
    )
    eval_interval: int = Field(100, ge=1, description="evaluate every N steps (when eval_tasksets are set)")
    eval_on_startup: bool = Field(True, description="evaluate at step 0 (when eval_tasksets are set)")
    bench_on_latest_checkpoint: bool = Field(
        False, description="benchmark(): only the newest checkpoint (plus the base when eval_on_startup)"
    )
    health_check_interval: float | None = Field(
        5.0, gt=0.0, description="seconds between engine health checks (null: no checks, no restarts)"
    )
    health_check_timeout: float = Field(60.0, gt=0.0, description="an engine silent this long is replaced")
    max_engine_restarts: int = Field(3, ge=0, description="replacements per engine before the run fails")
    engine_restart_timeout: float = Field(
        600.0,
        gt=0.0,
        description="seconds a replacement may take to start on the current version; requests wait as long",
    )


class SynchronizerConfig(Strict):
    """When and from where the explorer takes the trainer's newest weights (docs/DESIGN.md: weight sync)."""

    sync_method: Literal["none", "checkpoint", "broadcast", "memory"] = Field(
        "none",
        description="weight source; none: fixed weights; checkpoint: global_step_N/ dirs in checkpoint_dir; "
        "broadcast: torch.distributed from the trainer; memory: a state dict through the Ray object store",
    )
    checkpoint_dir: Path | None = Field(
        None, description="checkpoint: where the trainer writes global_step_N/ (default: RUN_DIR/checkpoints)"
    )
    max_staleness: int | None = Field(
        None, ge=0, description="versions an experience may lag the trainer's newest; staler ones are dropped"
    )
    sync_style: Literal["fixed", "dynamic_by_explorer", "dynamic_by_trainer"] = "fixed"
    sync_interval: int = Field(1, ge=1, description="steps per period")
    sync_offset: int = Field(0, ge=0, description="steps explored before the first sync")
    sync_timeout: float = Field(1200.0, gt=0.0, description="seconds to wait for a newer version")
    trainer_status: str | None = Field(
        None,
        description="a trainer status JSON file, or actor:<name> of a status actor (default: the weight hub "
        "for memory/broadcast, <checkpoint_dir>/trainer_status.json for checkpoint)",
    )


class MonitorConfig(Strict):
    mlflow_uri: str | None = Field(None, description="default: sqlite:///<abs run dir>/mlflow.db")
    experiment: str | None = Field(None, description="MLflow experiment (default: the config's `project`)")
    sample_rollouts: int = Field(8, ge=0, description="rollouts per step kept in the MLflow samples table")


class RayConfig(Strict):
    address: str | None = None
    num_cpus: int | None = Field(
        None, ge=1, description="logical CPUs for a local cluster (default: max(4, cores))"
    )
    object_store_memory_mib: int = Field(512, ge=64)


class Config(Strict):
    project: str = Field("rftflow", description="MLflow experiment name unless monitor.experiment is set")
    name: str = Field("explore", description="run name; the default run dir is runs/<name>-<timestamp>")
    plugin_dirs: list[Path] = Field(
        [], description="folders of workflow/reward modules, loaded in every worker"
    )
    model: ModelConfig = ModelConfig()
    buffer: BufferConfig = BufferConfig()
    explorer: ExplorerConfig = ExplorerConfig()
    synchronizer: SynchronizerConfig = SynchronizerConfig()
    monitor: MonitorConfig = MonitorConfig()
    ray: RayConfig = RayConfig()


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise InputError(f"cannot set '{dotted}': '{key}' is not a section", field=dotted)
        node = child
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` with c read as YAML, so numbers, booleans and null have their usual types."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InputError(f"expected key=value, got '{text}'", field="--set")
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read YAML (optional), apply `--set` overrides, validate; errors name the file and the key path."""
    import yaml

    tree: dict[str, Any] = {}
    source = str(path) if path else "--set"
    if path is not None:
        if not Path(path).is_file():
            raise InputError("config file not found", file=str(path))
        try:
            tree = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as exc:
            raise InputError(f"not valid YAML: {exc}", file=str(path)) from None
        if not isinstance(tree, dict):
            raise InputError("the top level must be a mapping", file=str(path))
    for text in overrides or []:
        key, value = parse_override(text)
        _set_path(tree, key, value)
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(f"{first['msg']}{more}", file=source, field=key) from None


def flatten(config: Config) -> dict[str, str]:
    """Dotted key → value, for MLflow params."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = str(value)

    walk("", config.model_dump(mode="json"))
    return out
