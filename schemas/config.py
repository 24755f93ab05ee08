"""The explorer's YAML configuration (pydantic). Field names follow Trinity-RFT where the meaning is the same.

Unknown keys and wrong types are refused with the key's full dotted path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from schemas.bounded_yaml import parse_yaml, read_config_file
from schemas.config_base import MAX_INT32, MAX_SECONDS, GivenPath, Strict
from schemas.config_paths import anchor_paths
from schemas.engine_config import RolloutModelConfig
from schemas.errors import InputError
from schemas.experience_ops import ExperienceOpConfig
from schemas.interpolation import env_values, hide_env, resolve_env
from schemas.rollout_policy import DynamicTimeoutConfig, OverRolloutConfig
from schemas.secrets import mask_tree
from schemas.trinity import is_trinity, translate

logger = logging.getLogger(__name__)
ASSETS = Path(__file__).resolve().parent.parent / "pipelines" / "assets"
DEFAULT_MODEL = ASSETS / "tiny-arith-llama"
TOOL_MODEL = ASSETS / "tiny-tool-llama"  # the tiny model also taught the `tool_math` calculator
DEFAULT_TRAIN = ASSETS / "tasksets" / "arith" / "train.jsonl"
DEFAULT_EVAL = ASSETS / "tasksets" / "arith" / "eval.jsonl"
# SQL table names: plain identifiers, short enough for PostgreSQL's 63 characters with "_steps" and an index.
SQL_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
SQL_NAME_MAX = 48


class RolloutArgs(Strict):
    """Sampling settings for one taskset; `n` is taken from repeat_times."""

    temperature: float = Field(1.0, ge=0.0, le=10.0, description="sampling temperature (0 to 10)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling")
    top_k: int = Field(-1, ge=-1, le=MAX_INT32, description="top-k sampling (-1: off)")
    max_tokens: int = Field(16, ge=1, description="max response tokens (below `max_model_len`)")
    ignore_eos: bool = Field(
        False, description="sample on past the end-of-sequence token, up to `max_tokens`"
    )
    logprobs: int = Field(
        0, ge=0, le=20, description="extra top-k logprobs per token (at most 20); the sampled token's is kept"
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
    path: GivenPath = Field(
        DEFAULT_TRAIN,
        description="file or directory (jsonl, Parquet), or a local Hugging Face dataset folder",
        json_schema_extra={"doc_default": "bundled `arith/train.jsonl`"},
    )
    subset_name: str | None = Field(
        None, description="a Hugging Face dataset folder's subset (config name), e.g. `main`"
    )
    split: str | None = Field(
        None,
        description="a Hugging Face dataset folder's split (default `train` when the path is one); setting "
        "this or `subset_name` reads the path as a dataset folder",
    )
    format: FormatConfig = FormatConfig()
    rollout_args: RolloutArgs = RolloutArgs()
    repeat_times: int = Field(4, ge=1, le=1024, description="samples per task (vLLM `n`; at most 1024)")
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
    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset({"eval_tasksets", "default_eval_workflow_type"})

    taskset: TasksetConfig = TasksetConfig()
    eval_tasksets: list[TasksetConfig] = Field(
        [],
        description="tasksets with the same fields as `taskset`, each evaluated whole, on the same engines",
    )
    default_eval_workflow_type: str = Field(
        "eval_math", description="workflow of eval tasksets that name none"
    )
    experience_ops: list[ExperienceOpConfig] = Field(
        [],
        description="ops run on each task's finished samples before they are written, in order: "
        "`{name, args}` each (see Experience ops); training steps only, never evals",
    )

    def workflow_for(self, taskset: TasksetConfig, is_eval: bool) -> str:
        return taskset.default_workflow_type or (self.default_eval_workflow_type if is_eval else "math")


class ExperienceBufferConfig(Strict):
    """Where committed experiences go (Trinity-RFT's `trainer_input.experience_buffer`)."""

    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset({"queue_capacity", "queue_timeout"})

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
        le=MAX_SECONDS,
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
    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset({"total_steps"})

    batch_size: int = Field(8, ge=1, le=1_000_000, description="tasks per step")
    total_epochs: int = Field(1, ge=1, le=10_000, description="passes over the taskset")
    total_steps: int | None = Field(
        None,
        ge=1,
        description="stop after this many steps (null: all epochs; the CLI without `--config` uses 4)",
    )
    explorer_input: ExplorerInput = ExplorerInput()
    trainer_input: TrainerInput = TrainerInput()


class ModelConfig(Strict):
    model_path: GivenPath = Field(
        DEFAULT_MODEL,
        description="a Hugging Face model directory (safetensors, tokenizer, chat template)",
        json_schema_extra={"doc_default": "bundled `tiny-arith-llama`"},
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

    mode: Literal["explore", "bench"] = Field(
        "explore",
        description="`explore` runs the explorer; `bench` benchmarks the checkpoints in "
        "`synchronizer.checkpoint_dir` instead (Trinity-RFT's mode of the same name)",
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
    def _room_for_a_prompt(self) -> Config:
        # vLLM refuses each request whose max_tokens leaves no room for its prompt, but only once it runs.
        rollout, inputs = self.explorer.rollout_model, self.buffer.explorer_input
        prompt = rollout.max_prompt_tokens
        limit = f"explorer.rollout_model.max_model_len ({rollout.max_model_len}): lower one, or raise it"
        for i, taskset in enumerate([inputs.taskset, *inputs.eval_tasksets]):
            where = ("eval_tasksets", i - 1) if i else ("taskset",)
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
    return key.strip(), parse_yaml(raw, "--set", key.strip()) if raw.strip() else ""


def validate_tree(tree: dict[str, Any], source: str) -> Config:
    """The config a tree of plain values makes; the first refusal is named by its dotted key."""
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(f"{first['msg']}{more}", file=source, field=key or None) from None


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read YAML (optional; a Trinity-RFT config is translated, see `schemas.trinity`; in rftflow's own,
    `${oc.env:NAME,default}` is resolved, see `schemas.interpolation`, and relative paths are the file's
    folder's, see `schemas.config_paths`), apply `--set` overrides (paths there: the working directory's),
    validate; errors name the file and the key path."""
    tree = read_config_file(Path(path)) if path is not None else {}
    env = env_values(tree)
    if is_trinity(tree):
        tree, notices = translate(tree, str(path))
        for notice in notices:
            logger.info("Trinity-RFT config %s: %s", path, notice)
    else:
        tree = resolve_env(tree, str(path))
        if path is not None:
            tree = anchor_paths(tree, Path(path).resolve().parent)
    for text in overrides or []:
        key, value = parse_override(text)
        _set_path(tree, key, value)
    tree = anchor_paths(tree, Path.cwd())  # what is still relative came from --set: saved absolute
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
