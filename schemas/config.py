"""The explorer's YAML configuration (pydantic). Field names follow Trinity-RFT where the meaning is the same.

Unknown keys and wrong types are refused with the key's full dotted path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
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

    temperature: float = Field(1.0, ge=0.0, description="sampling temperature")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    top_k: int = Field(-1, ge=-1, description="top-k sampling (-1: off)")
    max_tokens: int = Field(16, ge=1, description="max response tokens")
    logprobs: int = Field(
        0, ge=0, description="extra top-k logprobs per token; the sampled token's is always kept"
    )
    seed: int | None = Field(
        0,
        description="base sampling seed: each (task, run) derives its own, so a rerun samples the same "
        "responses (null: random)",
    )


class FormatConfig(Strict):
    prompt_key: str = Field("prompt", description="prompt field")
    response_key: str = Field("answer", description="reference-answer field")
    messages_key: str | None = Field(
        None, description="chat-messages field, used in place of the prompt when set"
    )


class TasksetConfig(Strict):
    name: str = Field("arith", description="taskset name, used in `task_uid` and metrics")
    path: Path = Field(
        DEFAULT_TRAIN,
        description="file or directory",
        json_schema_extra={"doc_default": "bundled `arith/train.jsonl`"},
    )
    format: FormatConfig = FormatConfig()
    rollout_args: RolloutArgs = RolloutArgs()
    repeat_times: int = Field(4, ge=1, description="samples per task (vLLM `n`)")
    default_workflow_type: str | None = Field(
        None,
        description="workflow name (see Workflows); null: `math` for training, `default_eval_workflow_type` "
        "for eval",
    )
    default_reward_fn_type: str | None = Field(
        None, description="reward function name; null: the workflow's own (`math_accuracy` for `math`)"
    )
    workflow_args: dict[str, Any] = Field(
        {}, description="passed to the workflow; `math` reads `system_prompt`"
    )
    reward_fn_args: dict[str, Any] = Field({}, description="keyword arguments of the reward function")
    on_bad_row: Literal["raise", "skip"] = Field(
        "raise",
        description="a row that cannot become a task (bad JSON, not UTF-8, a missing or wrong field): "
        "`raise` stops before any engine starts, naming file, line and field; `skip` leaves it out (it takes "
        "no position), counts it in `pipeline/skipped_rows/<taskset>` and prints the first reasons",
    )
    # 16 MiB holds a million-token prompt (~4 bytes a token) four times over, yet bounds what one line costs;
    # 1 GiB keeps a row far inside Arrow's 2 GiB per string array.
    max_row_bytes: int = Field(
        16 * 2**20,
        ge=1,
        le=2**30,
        description="longest jsonl line (without its newline), or a Parquet row's prompt (or messages) or "
        "answer, in bytes (16 MiB; at most 1 GiB); a longer one is a bad row, read past in 256 KiB chunks "
        "and never held whole",
    )


class ExplorerInput(Strict):
    taskset: TasksetConfig = TasksetConfig()
    eval_tasksets: list[TasksetConfig] = Field(
        [],
        description="tasksets with the same fields as `taskset`, each evaluated whole, on the same engines",
    )
    default_eval_workflow_type: str = Field(
        "eval_math", description="workflow of eval tasksets that name none"
    )

    def workflow_for(self, taskset: TasksetConfig, is_eval: bool) -> str:
        return taskset.default_workflow_type or (self.default_eval_workflow_type if is_eval else "math")


class ExperienceBufferConfig(Strict):
    """Where committed experiences go (Trinity-RFT's `trainer_input.experience_buffer`)."""

    storage_type: Literal["parquet", "sql"] = Field(
        "parquet",
        description="where committed experiences go: `parquet` (`experiences/step_N/` folders) or `sql` (two "
        "tables in a SQLAlchemy database; see Sinks)",
    )
    path: str | None = Field(
        None,
        description="`sql`: a SQLAlchemy URL (default `sqlite:///<absolute run dir>/experiences.db`; "
        "PostgreSQL: `postgresql+psycopg://user:password@host/db`). Must be null for `parquet`",
    )
    name: str | None = Field(
        None,
        pattern=SQL_NAME,
        max_length=SQL_NAME_MAX,
        description="`sql`: the experience table (default: the run dir's name with non-word characters as "
        "`_`); its commit log is `<name>_steps`. Letters, digits and `_`, at most 48",
    )
    queue_capacity: int | None = Field(
        None,
        ge=1,
        description="also feed each committed step to the Ray queue `<run name>/experience_queue`, holding "
        "at most this many steps (null: no queue)",
    )
    queue_timeout: float = Field(
        600.0,
        gt=0.0,
        description="seconds a committed step may wait for room in a full queue before the run fails (the "
        "step stays committed in the store)",
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
    total_epochs: int = Field(1, ge=1, description="passes over the taskset")
    total_steps: int | None = Field(
        None,
        ge=1,
        description="stop after this many steps (null: all epochs; the CLI without `--config` uses 4)",
    )
    explorer_input: ExplorerInput = ExplorerInput()
    trainer_input: TrainerInput = TrainerInput()


class ModelConfig(Strict):
    model_path: Path = Field(
        DEFAULT_MODEL,
        description="a Hugging Face model directory (safetensors, tokenizer, chat template)",
        json_schema_extra={"doc_default": "bundled `tiny-arith-llama`"},
    )


class RolloutModelConfig(Strict):
    engine_num: int = Field(1, ge=1, description="engine actors")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine")
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="`auto` (GPU if the Ray cluster has one), `cpu` or `gpu`"
    )
    dtype: str = Field("auto", description="vLLM dtype")
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="GPU only: share of GPU memory for vLLM"
    )
    cpu_kvcache_space_gib: int = Field(
        1, ge=1, description="CPU only: KV cache size in GiB (`VLLM_CPU_KVCACHE_SPACE`)"
    )
    max_model_len: int = Field(256, ge=16, description="prompt plus response tokens")
    enforce_eager: bool = Field(True, description="no CUDA graphs or torch.compile (required on CPU)")
    seed: int = Field(0, description="engine seed")
    engine_cpus: float = Field(1.0, gt=0.0, description="Ray CPUs reserved per engine actor")
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="longest prompt in tokens (null: what `max_model_len` leaves room for)"
    )
    prompt_overflow: Literal["refuse", "truncate"] = Field(
        "refuse",
        description="a longer prompt: `refuse` (the task fails at once, unretried, with the token count in "
        "its message) or `truncate` (keep its last `max_prompt_tokens` tokens, where a chat template puts "
        "the question's end and the generation prompt)",
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
    runner_per_model: int = Field(4, ge=1, description="task batches in flight per engine")
    max_timeout: float = Field(
        900.0, gt=0.0, description="seconds per task attempt; a timed-out attempt is cancelled"
    )
    max_retry_times: int = Field(
        2, ge=0, description="retries after an exception, a timeout or a malformed experience"
    )
    max_repeat_times_per_runner: int | None = Field(
        None,
        ge=1,
        description="split a task's repeats into sub-runs of at most this many, each with its own status "
        "(null: no split)",
    )
    batch_timeout: float | None = Field(
        None,
        gt=0.0,
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
        description="seconds between engine health checks (null: no checks, no restarts; see Failures and "
        "recovery)",
    )
    health_check_timeout: float = Field(
        60.0,
        gt=0.0,
        description="an engine that does not answer a check within this many seconds is replaced",
    )
    max_engine_restarts: int = Field(
        3, ge=0, description="replacements per engine before the run stops with a message"
    )
    engine_restart_timeout: float = Field(
        600.0,
        gt=0.0,
        description="seconds a replacement may take to start and load the current version; a request to a "
        "lost engine waits this long for it",
    )


class SynchronizerConfig(Strict):
    """When and from where the explorer takes the trainer's newest weights (docs/DESIGN.md: weight sync)."""

    sync_method: Literal["none", "checkpoint", "broadcast", "memory"] = Field(
        "none",
        description="weight source: `none` (fixed weights), `checkpoint` (`global_step_N/` dirs in "
        "`checkpoint_dir`), `broadcast` (torch.distributed from the trainer) or `memory` (a state dict "
        "through the Ray object store); see Weight sync",
    )
    checkpoint_dir: Path | None = Field(
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
    sync_timeout: float = Field(
        1200.0,
        gt=0.0,
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
    mlflow_uri: str | None = Field(
        None, description="tracking URI (default `sqlite:///<absolute run dir>/mlflow.db`)"
    )
    experiment: str | None = Field(None, description="MLflow experiment (default: `project`)")
    sample_rollouts: int = Field(8, ge=0, description="rollouts per step kept in the MLflow samples table")


class RayConfig(Strict):
    address: str | None = Field(None, description="Ray cluster to join (`--ray-address` overrides it)")
    num_cpus: int | None = Field(
        None, ge=1, description="logical CPUs of a local Ray (default: max(4, cores))"
    )
    object_store_memory_mib: int = Field(
        512,
        ge=64,
        description="object store size of a local Ray; for `memory` sync give it at least twice the model's "
        "bytes",
    )


class Config(Strict):
    project: str = Field("rftflow", description="MLflow experiment name, unless `monitor.experiment` is set")
    name: str = Field("explore", description="run name; the default run dir is `runs/<name>-<timestamp>`")
    plugin_dirs: list[Path] = Field(
        [],
        description="folders of workflow/reward modules, loaded in every worker (`--plugin-dir` adds to it)",
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
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InputError(f"expected key=value, got '{text}'", field="--set")
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read YAML (optional), apply `--set` overrides, validate; errors name the file and the key path."""
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
