"""The inference engine: a long-lived actor that owns a vLLM `AsyncLLM`.

It lives outside Ray Data (pool actors are rebuilt silently and cannot be messaged), so the rollout operator
only forwards requests to it. The model version is read when a request is dispatched, never at completion.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from schemas.config import RolloutModelConfig


@dataclass
class Sample:
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str


@dataclass
class Generation:
    """One request's result: the prompt as the engine saw it and `n` samples, stamped at dispatch."""

    prompt_ids: list[int]
    prompt_text: str
    model_version: int
    samples: list[Sample]


def use_gpu(cfg: RolloutModelConfig) -> bool:
    if cfg.device != "auto":
        return cfg.device == "gpu"
    import torch

    return torch.cuda.is_available()


def engine_env(cfg: RolloutModelConfig, gpu: bool) -> dict[str, str]:
    """Environment an engine process needs before vLLM is imported."""
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if not gpu:
        # On CPU gpu_memory_utilization is a fraction of RAM and its default fails; size the KV cache instead.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_space_gib)
    return env


class VLLMEngine:
    """Plain class (usable in-process); `ray.remote(VLLMEngine)` makes it the engine actor."""

    def __init__(self, model_path: str, cfg: dict[str, Any], model_version: int = 0):
        rollout = RolloutModelConfig.model_validate(cfg)
        gpu = use_gpu(rollout)
        os.environ.update(engine_env(rollout, gpu))
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=str(model_path),
            tensor_parallel_size=rollout.tensor_parallel_size,
            dtype=rollout.dtype,
            max_model_len=rollout.max_model_len,
            enforce_eager=rollout.enforce_eager,
            seed=rollout.seed,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            disable_log_stats=True,
        )
        self.llm = AsyncLLM.from_engine_args(args)
        self.tokenizer = self.llm.get_tokenizer()
        self.model_path = str(model_path)
        self.model_version = model_version

    def ready(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "model_version": self.model_version}

    def get_model_version(self) -> int:
        return self.model_version

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def chat(self, messages: list[dict[str, str]], sampling: dict[str, Any]) -> dict[str, Any]:
        return await self.generate(self.render_chat(messages), sampling)

    async def generate(self, prompt: str | list[int], sampling: dict[str, Any]) -> dict[str, Any]:
        """Sample `sampling['n']` responses; logprobs are those of the sampled tokens."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        prompt_ids = (
            self.tokenizer.encode(prompt, add_special_tokens=True) if isinstance(prompt, str) else prompt
        )
        version = self.model_version  # stamped at dispatch
        params = SamplingParams(**sampling, output_kind=RequestOutputKind.FINAL_ONLY)
        params.logprobs = sampling.get("logprobs") or 0
        final = None
        async for output in self.llm.generate(
            {"prompt_token_ids": list(prompt_ids)}, params, uuid.uuid4().hex
        ):
            final = output
        samples = []
        for choice in final.outputs:
            ids = list(choice.token_ids)
            lps = [entry[token].logprob for token, entry in zip(ids, choice.logprobs or [], strict=True)]
            samples.append(Sample(ids, lps, str(choice.finish_reason), choice.text))
        text = self.tokenizer.decode(prompt_ids)
        return asdict(Generation(list(prompt_ids), text, version, samples))

    def shutdown(self) -> None:
        self.llm.shutdown()
