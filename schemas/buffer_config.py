"""The config's `buffer` section: the tasksets a run explores and evaluates (where each is read from, how its
rows become prompts, how they are sampled), and where committed experiences go (Trinity-RFT's
`explorer_input` and `trainer_input.experience_buffer`). Part of `schemas.config`, which re-exports its names.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from schemas.config_base import ASSETS, MAX_INT32, MAX_SECONDS, GivenPath, Strict
from schemas.experience_ops import ExperienceOpConfig

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
    info_key: str | None = Field(
        "info",
        description="the task's own data (a JSON object, or a Parquet struct or JSON-text column; at most 64 "
        "KiB as JSON), given to reward functions that take `info` and written to experiences as `info.task`; "
        "optional in each row (null: never read)",
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
