"""The vLLM settings an engine's config makes: whether it runs on a GPU, the environment its process needs
before vLLM is imported, and vLLM's engine arguments.

One place, so that every engine built from the same config (the engine actor, a benchmark's peer engine
under Ray Data LLM) runs with exactly these settings.
"""

from __future__ import annotations

import os
from typing import Any

from operators.engine.vllm_plugin import BUSY_WAIT_ENV
from schemas.engine_config import RolloutModelConfig
from schemas.lora_config import LoraConfig


def use_gpu(cfg: RolloutModelConfig) -> bool:
    if cfg.device != "auto":
        return cfg.device == "gpu"
    import torch  # heavy, deferred: the driver imports the engine modules (to start engines) without torch

    return torch.cuda.is_available()


def engine_env(cfg: RolloutModelConfig, gpu: bool) -> dict[str, str]:
    """Environment an engine process needs before vLLM is imported."""
    busy_wait = cfg.busy_wait if cfg.busy_wait is not None else gpu
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", BUSY_WAIT_ENV: str(int(busy_wait))}
    if not gpu:
        # On CPU gpu_memory_utilization is a fraction of RAM and its default fails; size the KV cache instead.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gib)
    return env


def engine_args(cfg: RolloutModelConfig, gpu: bool, lora: LoraConfig | None = None) -> dict[str, Any]:
    """vLLM engine arguments for `cfg`, besides the model and rftflow's worker extension: one place, so
    another engine built from the same config (a benchmark's peer) runs with exactly these settings. With
    `lora`, LoRA is enabled: one adapter serves at a time (a swap drains the old one's requests), the CPU
    cache holds the versions kept loaded."""
    extra: dict[str, Any] = {}
    if lora is not None:
        extra = {
            "enable_lora": True,
            "max_loras": 1,
            "max_lora_rank": lora.max_lora_rank,
            "max_cpu_loras": lora.max_cpu_loras,
            "fully_sharded_loras": lora.fully_sharded_loras,
            "lora_dtype": lora.lora_dtype,
        }
    chunked = cfg.enable_chunked_prefill if cfg.enable_chunked_prefill is not None else gpu
    args = {
        "enable_chunked_prefill": chunked,
        # unchunked, a step must hold a whole prompt
        "max_num_batched_tokens": None if chunked else max(2048, cfg.max_model_len),
        "tensor_parallel_size": cfg.tensor_parallel_size,
        # more than one GPU rank: vLLM's Ray workers, one in each bundle of the engine's placement group
        "distributed_executor_backend": "ray" if gpu and cfg.tensor_parallel_size > 1 else None,
        "dtype": cfg.dtype,
        "max_model_len": cfg.max_model_len,
        "enforce_eager": cfg.enforce_eager,
        "seed": cfg.seed,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "disable_log_stats": True,
        # vLLM's "Loading safetensors checkpoint shards" bar goes with its INFO lines (`-v`), not with ERROR
        "use_tqdm_on_load": os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() in ("DEBUG", "INFO"),
        **extra,
    }
    if not cfg.json_whitespace:
        args["structured_outputs_config"] = compact_json()
    return args


def compact_json() -> Any:
    """vLLM's structured outputs held to compact JSON (`json_whitespace: false`), on xgrammar: vLLM's default
    backend, and one of the two that can hold it."""
    from vllm.config import StructuredOutputsConfig  # heavy, deferred: only engine processes import vLLM

    return StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)
