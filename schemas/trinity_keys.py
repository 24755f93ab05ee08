"""Every key of a Trinity-RFT 0.6 config (its dataclasses in `trinity/common/config.py`), and what rftflow
does with it: the single source for the translation (`schemas.trinity`) and its docs page
(`docs/trinity_keys.py`).

The explorer-side sections list every key of Trinity's dataclasses; a trainer-side section is one ignored
entry that still names the keys Trinity knows inside it, so a misspelt one is refused. Free-form dicts
(`workflow_args`, `reward_fn_args`, a selector's `kwargs`, `monitor_args`) pass through unchecked, as Trinity
passes them. A key Trinity adds later is added here.
"""

from __future__ import annotations

from schemas.trinity_model_keys import AUTO, MODEL, ROLLOUT_MODEL, THINKING, TRAINER
from schemas.trinity_rules import Differs, Each, HasAny, Ignore, Map, Read, Refuse, Section, ignored
from schemas.trinity_transforms import (
    REWARDS,
    WORKFLOWS,
    checkpoint_dir,
    experience_storage,
    from_key,
    mlflow_uri,
    mode,
    model_default,
    monitor_type,
    operator_args,
    operator_name,
    ray_address,
    reject_taskset_storage,
    renamed,
    repeat_times,
    response_tokens,
    selector,
    serve_key,
    sql_only,
    sync_method,
    sync_style,
    value_of,
)

READING = "the reading side is the trainer's"


SELECTOR = Section(
    {
        "selector_type": Map("selector_type", "Trinity's built-in selectors; another is refused", selector),
        "seed": Map("seed"),
        "feature_keys": Map("feature_keys"),
        "kwargs": Map("kwargs", "free-form, as it is"),
    },
    into="data_selector",
)
FORMAT = Section(
    {
        "prompt_type": Refuse("rftflow builds chat messages (Trinity's `messages`)", Differs("messages")),
        "prompt_key": Map("prompt_key"),
        "response_key": Map("response_key", "(Trinity's default is `response`, rftflow's `answer`)"),
        "system_prompt_key": Refuse("a per-row system prompt changes the prompts"),
        "system_prompt": Refuse("a system prompt changes the prompts; give it in `workflow_args`"),
        "messages_key": Map("messages_key"),
        "tools_key": Refuse("tool lists from the rows are not read", Differs("tools")),
        "image_key": Refuse("multimodal rows are not supported"),
        "video_key": Refuse("multimodal rows are not supported"),
        "reply_prefix": Refuse("a reply prefix changes the prompts"),
        "workflow_key": Refuse("a per-row workflow is not supported"),
        "reward_fn_key": Refuse("a per-row reward function is not supported"),
        "chosen_key": Ignore("preference data is the trainer's"),
        "rejected_key": Ignore("preference data is the trainer's"),
        "enable_concatenated_multi_turn": Refuse("concatenated multi-turn samples are not supported"),
        "chat_template": Refuse("a taskset's own chat template is not supported"),
        "enable_thinking": THINKING,
    },
    into="format",
)
ROLLOUT_ARGS = Section(
    {
        "temperature": Map("temperature", "else `model.temperature`", default=model_default("temperature")),
        "top_p": Map("top_p", "else `model.top_p`", default=model_default("top_p")),
        "top_k": Map("top_k", "else `model.top_k`", default=model_default("top_k")),
        "logprobs": Map("logprobs", "else `model.logprobs`", default=model_default("logprobs")),
        "max_tokens": Map("max_tokens", "else `model.max_response_tokens`", default=response_tokens),
        "n": Ignore("Trinity sets it from the taskset's repeat_times"),
    },
    into="rollout_args",
)
TASKSET = Section(
    {
        "name": Map("name"),
        "storage_type": Map("", "only `file` (jsonl, Parquet, a dataset folder)", reject_taskset_storage),
        "path": Map("path"),
        "repeat_times": Map(
            "repeat_times", "else `algorithm.repeat_times` (1 for an eval taskset)", default=repeat_times
        ),
        "default_workflow_type": Map(
            "default_workflow_type",
            "else `explorer_input.default_workflow_type`; Trinity's name renamed",
            renamed(WORKFLOWS),
            default=from_key("buffer.explorer_input.default_workflow_type"),
        ),
        "default_reward_fn_type": Map(
            "default_reward_fn_type",
            "else `explorer_input.default_reward_fn_type`; Trinity's name renamed",
            renamed(REWARDS),
            default=from_key("buffer.explorer_input.default_reward_fn_type"),
        ),
        "rollout_args": ROLLOUT_ARGS,
        "workflow_args": Map("workflow_args", "free-form, as it is"),
        "reward_fn_args": Map("reward_fn_args", "free-form, as it is"),
        "task_selector": SELECTOR,  # Trinity's old name for data_selector
        "data_selector": SELECTOR,
        "split": Map("split"),
        "subset_name": Map("subset_name"),
        "format": FORMAT,
        "max_retry_times": Ignore("retries of reading a queue or database; rftflow reads files"),
        "max_retry_interval": Ignore("retries of reading a queue or database; rftflow reads files"),
        "enable_progress_bar": Ignore("a display option"),
        **ignored(("index", "is_eval", "batch_size", "total_epochs", "total_steps", "ray_namespace"), AUTO),
    }
)
EXPERIENCE_BUFFER = Section(
    {
        "name": Map("name", "for a SQL buffer", sql_only),
        "storage_type": Map(
            "storage_type",
            "`queue` with a database `path`, or `sql`: `sql`; `queue`, `file`: Parquet in the run dir",
            experience_storage,
            always=True,
        ),
        "path": Map("path", "for a SQL buffer", sql_only),
        **ignored(("capacity", "max_read_timeout", "replay_buffer", "max_retry_times"), READING),
        **ignored(("max_retry_interval", "split", "subset_name", "format", "enable_progress_bar"), READING),
        **ignored(("data_selector", "schema_type", "batch_size", "tokenizer_path"), READING),
        **ignored(("index", "total_epochs", "total_steps", "ray_namespace"), AUTO),
    },
    into="experience_buffer",
)
BUFFER = Section(
    {
        "batch_size": Map("batch_size"),
        "train_batch_size": Ignore(TRAINER),
        "total_epochs": Map("total_epochs"),
        "total_steps": Map("total_steps"),
        "explorer_input": Section(
            {
                "taskset": Section(TASKSET.keys, into="taskset"),
                "tasksets": Each(TASKSET, "tasksets"),
                "eval_tasksets": Each(TASKSET, "eval_tasksets"),
                "default_workflow_type": Read("each taskset's `default_workflow_type`", "where it sets none"),
                "default_eval_workflow_type": Map(
                    "default_eval_workflow_type", "renamed", renamed(WORKFLOWS)
                ),
                "default_reward_fn_type": Read(
                    "each taskset's `default_reward_fn_type`", "where it sets none"
                ),
            },
            into="explorer_input",
        ),
        "trainer_input": Section(
            {"experience_buffer": EXPERIENCE_BUFFER, "auxiliary_buffers": Ignore(TRAINER)},
            into="trainer_input",
        ),
        **ignored(("explorer_output", "tokenizer_path", "cache_dir"), AUTO),
    },
    into="buffer",
)
EXPLORER = Section(
    {
        "name": Ignore("Trinity's actor name"),
        "runner_per_model": Map("runner_per_model"),
        "runner_prepare_concurrency": Ignore(
            "a Trinity start-up workaround; rftflow's runners start otherwise"
        ),
        "runner_prepare_max_retries": Ignore(
            "a Trinity start-up workaround; rftflow's runners start otherwise"
        ),
        "max_timeout": Map("max_timeout", "Trinity's default 1800", default=value_of(1800.0)),
        "max_retry_times": Map("max_retry_times"),
        "env_vars": Refuse("environment variables for the workflow runners are not supported"),
        "concurrent_mode": Refuse("rftflow runs a runner's tasks its own way", Differs("sequential")),
        "max_repeat_times_per_runner": Map("max_repeat_times_per_runner"),
        "runner_num": Ignore("deprecated in Trinity: `runner_per_model`"),
        "rollout_model": ROLLOUT_MODEL,
        "auxiliary_models": Refuse("auxiliary models are not supported"),
        "eval_interval": Map("eval_interval"),
        "eval_on_startup": Map("eval_on_startup"),
        "bench_on_latest_checkpoint": Map("bench_on_latest_checkpoint"),
        "proxy_port": Map("", "serve.port (serve mode)", serve_key("serve.port")),
        "listen_address": Map(
            "",
            "serve.host (serve mode; Trinity's default 0.0.0.0 needs serve.admin_key)",
            serve_key("serve.host"),
            default=lambda t, where: "0.0.0.0" if t.get("mode") == "serve" else None,
        ),
        "service_status_check_interval": Map(
            "", "serve.health_check_interval_s (serve mode)", serve_key("serve.health_check_interval_s")
        ),
        "min_running_model_num": Map(
            "", "serve.min_running_engines (serve mode)", serve_key("serve.min_running_engines")
        ),
        "db_url": Map("", "serve.db_url (serve mode)", serve_key("serve.db_url")),
        "over_rollout": Section(
            {
                "ratio": Map("ratio"),
                "wait_after_min": Map("wait_after_min"),
                "return_partial_tasks": Refuse("returning partial tasks is not supported (see `recycle`)"),
            },
            into="over_rollout",
        ),
        "dynamic_timeout": Section(
            {
                "enable": Map("enable"),
                "warmup_min_steps": Ignore("counted in steps there; rftflow counts tasks: `min_samples`"),
                "ratio": Map("ratio"),
            },
            into="dynamic_timeout",
        ),
        "runner_state_report_interval": Ignore("a Trinity log of runner states"),
        "max_inflight_batches": Ignore(
            "Trinity's rollout coordinator; rftflow bounds the lead with `synchronizer.max_staleness`"
        ),
    },
    into="explorer",
)
SYNCHRONIZER = Section(
    {
        "sync_method": Map(
            "sync_method",
            "nccl, online: checkpoint (only the explorer runs here); offline: checkpoint; memory",
            sync_method,
            default=value_of("nccl"),
        ),
        "sync_style": Map(
            "sync_style", "trainer_driven, explorer_driven: rftflow's dynamic_ names", sync_style
        ),
        "sync_interval": Map("sync_interval"),
        "explorer_sync_interval": Map("sync_interval", "over `sync_interval`: the explorer's"),
        "trainer_sync_interval": Ignore(TRAINER),
        "sync_offset": Map("sync_offset"),
        "sync_timeout": Map("sync_timeout", "Trinity's default 3600", default=value_of(3600.0)),
        "group_name": Ignore("Trinity's NCCL group name"),
        "wait_for_checkpoint": Ignore(
            "Trinity's trainer-driven checkpoint wait; rftflow's sync waits its own way"
        ),
        **ignored(("explorer_world_size", "ray_namespace"), AUTO),
    },
    into="synchronizer",
)
MONITOR = Section(
    {
        "monitor_type": Map("", "rftflow tracks in MLflow (a notice for another)", monitor_type),
        "monitor_args": Map("mlflow_uri", "its `uri` for MLflow; free-form otherwise", mlflow_uri),
        "detailed_stats": Ignore("Trinity's own statistics"),
        "enable_ray_timeline": Ignore("a Ray profiling option"),
        "cache_dir": Ignore(AUTO),
    },
    into="monitor",
)
CLUSTER = Section(
    {
        "ray_address": Map("ray.address", "`auto`: rftflow's default", ray_address),
        **ignored(("node_num", "gpu_per_node"), "the GPU layout is Ray's"),
        **ignored(("total_gpu_num", "rollout_gpu_num", "auxiliary_model_gpu_num", "explorer_gpu_num"), AUTO),
        **ignored(("trainer_gpu_num", "trainer_node_num", "trainer_gpu_num_per_node"), AUTO),
    }
)
OPERATOR = Section(
    {
        "name": Map("name", "reward_filter, reward_std_filter only", operator_name),
        "args": Map(
            "args",
            "only `threshold`: reward_filter's min_reward, reward_std_filter's threshold",
            operator_args,
            always=True,
        ),
    }
)
DATA_PROCESSOR = Section(
    {
        "task_pipeline": Refuse(
            "a task pipeline rewrites the taskset before the run",
            HasAny(("operators", "config_path")),
            otherwise="no operators: the taskset is read as it is",
            keys=(
                "operators",
                "num_process",
                "config_path",
                "inputs",
                "output",
                "target_fields",
                "priority_weights",
                "top_k",
            ),
        ),
        "experience_pipeline": Section(
            {
                "operators": Each(OPERATOR, "buffer.explorer_input.experience_ops"),
                "save_input": Ignore("Trinity's copy of the experiences before the operators"),
                "input_save_path": Ignore("Trinity's copy of the experiences before the operators"),
                "inputs": Refuse("extra experience inputs are not supported"),
                "output": Ignore(AUTO),
            }
        ),
    }
)
ALGORITHM_KEYS = (
    "algorithm_type",
    "optimizer",
    "sample_strategy",
    "sample_strategy_args",
    "advantage_fn",
    "advantage_fn_args",
    "kl_penalty_fn",
    "kl_penalty_fn_args",
    "policy_loss_fn",
    "policy_loss_fn_args",
    "kl_loss_fn",
    "kl_loss_fn_args",
    "entropy_loss_fn",
    "entropy_loss_fn_args",
    "loss_agg_mode",
    "enable_router_replay",
    "bypass_old_logprobs",
    "rollout_correction",
)
TRAINER_KEYS = (
    "name",
    "trainer_type",
    "trainer_strategy",
    "save_interval",
    "enable_preview",
    "total_steps",
    "save_hf_checkpoint",
    "grad_clip",
    "use_dynamic_bsz",
    "use_remove_padding",
    "balance_batch",
    "critic_warmup",
    "max_token_len_per_gpu",
    "ulysses_sequence_parallel_size",
    "fix_actor_microbatch_loss_scale",
    "param_offload",
    "optimizer_offload",
    "grad_offload",
    "offload_policy",
    "save_strategy",
    "max_checkpoints_to_keep",
    "megatron",
    "trust_remote_code",
    "trainer_config",
    "trainer_config_path",
)
# The whole config, in the order its keys are applied.
TRINITY = Section(
    {
        "mode": Map(
            "mode",
            "explore, both: an explore run; bench; serve (pipelines.serve); train, colocate refused",
            mode,
            default=value_of("both"),
        ),
        "project": Map("project"),
        "group": Ignore("a monitor grouping in Trinity"),
        "name": Map("name"),
        "checkpoint_root_dir": Map(
            "synchronizer.checkpoint_dir",
            "joined with `project` and `name`, as Trinity's job dir",
            checkpoint_dir,
        ),
        "checkpoint_job_dir": Ignore(AUTO),
        "ray_namespace": Ignore("Ray's namespace is rftflow's own"),
        "continue_from_checkpoint": Ignore("rftflow resumes a run from its run dir"),
        "ignore_validator_suggestions": Ignore("Trinity's validator only"),
        "algorithm": Section(
            {
                "repeat_times": Read("the taskset's `repeat_times`", "where it sets none"),
                **ignored(ALGORITHM_KEYS, TRAINER),
            }
        ),
        "data_processor": DATA_PROCESSOR,
        "model": MODEL,
        "cluster": CLUSTER,
        "buffer": BUFFER,
        "explorer": EXPLORER,
        "trainer": Ignore(TRAINER, TRAINER_KEYS),
        "monitor": MONITOR,
        "synchronizer": SYNCHRONIZER,
        "service": Ignore("Trinity's Data-Juicer service", ("data_juicer",)),
        "log": Ignore(
            "Trinity's logging; rftflow logs with `logging`", ("level", "group_by_node", "save_dir")
        ),
        "stages": Refuse("multi-stage runs are not supported"),
    }
)
