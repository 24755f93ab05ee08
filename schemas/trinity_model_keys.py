"""The model and engine keys of a Trinity-RFT 0.6 config (`model`, `explorer.rollout_model`), part of the key
table in `schemas.trinity_keys`; the reasons and helpers the rest of the table shares are here too.
"""

from __future__ import annotations

from schemas.trinity_lora import adapter, engine_dtype, with_adapter
from schemas.trinity_rules import Differs, Enabled, Given, Ignore, Map, Read, Refuse, Section, ignored
from schemas.trinity_transforms import api_key, length, value_of

TRAINER = "trainer-side"
AUTO = "Trinity sets it itself at start-up"
LORA_AUTO = "Trinity sets it from `model.lora_configs`; rftflow does too"
PER_TASKSET = "set it under `model` or in each taskset's `rollout_args`; rftflow has no per-engine sampling"
THINKING = Refuse(
    "thinking mode is not passed to the chat template",
    otherwise="rftflow passes no enable_thinking: the chat template's own default applies",
)
TINKER_KEYS = ("enable", "rank", "seed", "train_mlp", "train_attn", "train_unembed", "base_url")
EXTERNAL_KEYS = ("enable", "base_url_env", "api_key_env", "model_name")
MODEL = Section(
    {
        "model_path": Map("model.model_path"),
        "trust_remote_code": Refuse("rftflow does not run a model's own code"),
        "critic_model_path": Ignore(TRAINER),
        "custom_chat_template": Refuse("a custom chat template is not supported"),
        "chat_template_path": Refuse("a custom chat template is not supported"),
        **{k: Read("each taskset's `rollout_args`", "where it sets none") for k in ("temperature", "top_p")},
        **{k: Read("each taskset's `rollout_args`", "where it sets none") for k in ("top_k", "logprobs")},
        "max_model_len": Map(
            "explorer.rollout_model.max_model_len",
            "Trinity's length rules",
            length("max_model_len", "max_response_tokens"),
            always=True,
        ),
        "max_prompt_tokens": Map(
            "explorer.rollout_model.max_prompt_tokens",
            "Trinity's length rules",
            length("max_prompt_tokens"),
            always=True,
        ),
        "max_response_tokens": Read(
            "each taskset's `rollout_args.max_tokens`", "where it sets none; Trinity's length rules"
        ),
        "min_response_tokens": Refuse("a minimum response length is not supported"),
        "enable_prompt_truncation": Ignore(
            "rftflow refuses an overlong prompt or keeps its end: `explorer.rollout_model.prompt_overflow`"
        ),
        "repetition_penalty": Refuse("a repetition penalty is not supported", Differs(1.0)),
        "enable_thinking": THINKING,
        "lora_configs": Map(
            "model.lora", "its one entry; Trinity's defaults (rank 32, alpha 32, all-linear)", adapter
        ),
        **{
            k: Map(f"model.lora.{k}", "with an adapter in `model.lora_configs`", with_adapter)
            for k in ("max_cpu_loras", "fully_sharded_loras")
        },
        "rope_scaling": Refuse("RoPE scaling is not supported"),
        "rope_theta": Refuse("a RoPE theta is not supported"),
        "tinker": Refuse("the Tinker service is not supported", Enabled(), keys=TINKER_KEYS),
        "external_model": Refuse("an external API model is not supported", Enabled(), keys=EXTERNAL_KEYS),
    }
)
ROLLOUT_MODEL = Section(
    {
        "model_path": Refuse("set the model in `model.model_path`"),
        "name": Ignore("an engine's name in Trinity"),
        "trust_remote_code": Refuse("rftflow does not run a model's own code"),
        "engine_type": Refuse("rftflow runs vLLM engines", Differs("vllm")),
        "engine_num": Map("engine_num"),
        "tensor_parallel_size": Map("tensor_parallel_size"),
        "data_parallel_size": Refuse("data parallelism inside an engine is not supported", Differs(1)),
        "pipeline_parallel_size": Refuse("pipeline parallelism is not supported", Differs(1)),
        "enable_expert_parallel": Refuse("expert parallelism is not supported"),
        "gpu_per_engine": Ignore(AUTO),
        "use_v1": Refuse("rftflow's vLLM has only its V1 engine", Differs(True)),
        "extra_engine_args": Refuse("extra vLLM engine arguments are not passed"),
        "enforce_eager": Map("enforce_eager", "(Trinity's default is false, rftflow's true)"),
        "enable_prefix_caching": Ignore("a vLLM option rftflow leaves at vLLM's default"),
        "enable_chunked_prefill": Map("enable_chunked_prefill"),
        "gpu_memory_utilization": Map("gpu_memory_utilization"),
        "dtype": Map(
            "dtype",
            "Trinity's default `bfloat16`; `float32` with an adapter (its delivery probe)",
            default=engine_dtype,
        ),
        "seed": Map("seed", "Trinity's default 42", default=value_of(42)),
        **{k: Refuse(PER_TASKSET, Given()) for k in ("temperature", "top_p", "top_k", "logprobs")},
        "max_model_len": Map("max_model_len", "over `model.max_model_len`"),
        "max_prompt_tokens": Map("max_prompt_tokens", "over `model.max_prompt_tokens`"),
        "max_response_tokens": Refuse("set it as `model.max_response_tokens`", Given()),
        "min_response_tokens": Refuse("a minimum response length is not supported"),
        "enable_prompt_truncation": Ignore("as `model.enable_prompt_truncation`"),
        "repetition_penalty": Refuse("a repetition penalty is not supported", Differs(1.0)),
        "ignore_eos": Refuse("set it in each taskset's `rollout_args.ignore_eos`"),
        "enable_multimodal": Refuse("multimodal models are not supported"),
        "chat_template": Refuse("a custom chat template is not supported"),
        "enable_thinking": THINKING,
        "enable_history": Ignore("Trinity's record of model calls; rftflow writes experiences itself"),
        "enable_openai_api": Map("enable_openai_api"),
        "enable_log_requests": Ignore("a vLLM logging option"),
        "base_port": Map("port", "the first engine's API port"),
        "api_key": Map("api_key", "`EMPTY` is no key", api_key),
        "enable_auto_tool_choice": Ignore("a vLLM option rftflow leaves at vLLM's default"),
        "tool_call_parser": Map("tool_call_parser"),
        "reasoning_parser": Map("reasoning_parser"),
        "external_model_config": Refuse(
            "an external API model is not supported", Enabled(), keys=EXTERNAL_KEYS
        ),
        "nnodes": Refuse("an engine across nodes is not supported", Differs(1)),
        "node_rank": Ignore(AUTO),
        "enable_return_routed_experts": Ignore(AUTO),
        "weight_sync_buffer_size": Ignore("Trinity's NCCL chunk size; rftflow's weight sync sizes its own"),
        **ignored(("bundle_indices", "engine_id", "ray_namespace", "ray_actor_name", "sync_method"), AUTO),
        **ignored(("checkpoint_job_dir", "cuda_visible_devices"), AUTO),
        "enable_lora": Ignore(LORA_AUTO),
        "enable_runtime_lora_updating": Refuse(
            "vLLM's adapter-loading HTTP route would let any caller swap the policy; the fleet loads adapters"
        ),
        "lora_modules": Ignore(LORA_AUTO),
        "lora_kwargs": Ignore(LORA_AUTO),
        "rope_scaling": Refuse("RoPE scaling is not supported"),
        "rope_theta": Refuse("a RoPE theta is not supported"),
    },
    into="rollout_model",
)
