"""`explorer.rollout_model`: how each engine is built, and the OpenAI endpoint it serves."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from schemas.config_base import MAX_TOKENS, Strict

LOCAL_HOST = "127.0.0.1"
LOCAL_HOSTS = frozenset({LOCAL_HOST, "localhost", "::1"})


class RolloutModelConfig(Strict):
    # resumable: a resumed run may change these (pipelines/control/resume_check.py); the rest are its identity
    free_on_resume: ClassVar[frozenset[str]] = frozenset(
        {
            "engine_num",
            "tensor_parallel_size",
            "device",
            "gpu_memory_utilization",
            "cpu_kvcache_space_gib",
            "engine_cpus",
            "busy_wait",
            "placement",
            "host",
            "port",
            "api_key",
            "max_request_bytes",
        }
    )

    engine_num: int = Field(1, ge=1, le=1024, description="engine actors")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs per engine")
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto", description="`auto` (GPU if the Ray cluster has one), `cpu` or `gpu`"
    )
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto",
        description="vLLM dtype: `auto`, `half`, `float16`, `bfloat16`, `float` or `float32`. On an x86 CPU "
        "without native bfloat16 (no AVX-512 BF16 or AMX), `float32` samples a bfloat16 model several times "
        "faster; the engine logs a warning there",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="GPU only: share of GPU memory for vLLM"
    )
    cpu_kvcache_space_gib: int = Field(
        1, ge=1, le=4096, description="CPU only: KV cache size in GiB (`VLLM_CPU_KVCACHE_SPACE`)"
    )
    max_model_len: int = Field(256, ge=16, le=MAX_TOKENS, description="prompt plus response tokens")
    enforce_eager: bool = Field(True, description="no CUDA graphs or torch.compile (required on CPU)")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="engine seed (0 to 2^32-1, as NumPy takes)")
    engine_cpus: float = Field(1.0, gt=0.0, le=1024.0, description="Ray CPUs reserved per engine actor")
    placement: Literal["spread", "pack"] = Field(
        "spread",
        description="where engines go on a multi-node cluster: `spread` (across nodes, a preference: a "
        "replacement may land on a node that already holds one) or `pack` (onto as few nodes as they fit); "
        "each engine's tensor-parallel ranks always share one node",
    )
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="longest prompt in tokens (null: what `max_model_len` leaves room for)"
    )
    prompt_overflow: Literal["refuse", "truncate"] = Field(
        "refuse",
        description="a longer prompt: `refuse` (the task fails at once, unretried, with the token count in "
        "its message) or `truncate` (keep its last `max_prompt_tokens` tokens, where a chat template puts "
        "the question's end and the generation prompt)",
    )

    enable_chunked_prefill: bool | None = Field(
        None,
        description="vLLM's chunked prefill; null: on for GPU, off for CPU, where vLLM 0.32's sampler "
        "crashes the engine when a seeded request's prefill is chunked ('CPU Generator does not use offset')",
    )
    busy_wait: bool | None = Field(
        None,
        description="vLLM's engine core spins while it waits for its worker's results; null: spin on GPU "
        "(vLLM's default), sleep 0.2 ms between checks on CPU, where the spin takes most of a core from the "
        "model and the pipeline",
    )
    enable_openai_api: bool = Field(
        False,
        description="serve vLLM's OpenAI API (chat completions, completions, responses, Anthropic messages, "
        "`/v1/models`) on each engine, gated and recorded per session; agent workflows need it",
    )
    host: str = Field(
        LOCAL_HOST,
        min_length=1,
        description="address the OpenAI API listens on; any other than 127.0.0.1 needs `api_key`",
    )
    port: int = Field(
        0,
        ge=0,
        le=65535,
        description="OpenAI API port of the first engine (engine i: port + i); 0: a free port each",
    )
    api_key: str | None = Field(
        None,
        min_length=1,
        description="the engine's own key (Bearer token): every `/v1` request needs it or a run's session "
        "key; a generating call made with it belongs to no session and is not recorded",
    )
    max_request_bytes: int = Field(
        64 * 2**20,
        ge=1024,
        description="the largest OpenAI API request body; a larger one is refused (413) unread",
    )
    tool_call_parser: str | None = Field(
        None,
        min_length=1,
        description="vLLM's tool call parser for the OpenAI API (e.g. `hermes`): turns "
        "tool calls in the model's text into `tool_calls`",
    )
    json_whitespace: bool = Field(
        True,
        description="whether output held to JSON (a forced tool call, a JSON response format) may put "
        "whitespace between its tokens; false: compact JSON only, so a model that is not trained to stop "
        "cannot fill its reply with whitespace (vLLM's `disable_any_whitespace`)",
    )
    reasoning_parser: str | None = Field(
        None, min_length=1, description="vLLM's reasoning parser for the OpenAI API (e.g. `deepseek_r1`)"
    )

    @model_validator(mode="after")
    def _key_off_this_machine(self) -> RolloutModelConfig:
        # Anyone who can reach the port could sample from the model, or spend its time.
        if self.enable_openai_api and self.host not in LOCAL_HOSTS and self.api_key is None:
            raise ValueError(
                f"host {self.host!r} serves the OpenAI API beyond this machine: set api_key too, which every "
                "request must then present"
            )
        if self.port and self.port + self.engine_num - 1 > 65535:
            raise ValueError(f"ports {self.port}..{self.port + self.engine_num - 1} run past 65535")
        return self

    @model_validator(mode="after")
    def _room_for_a_response(self) -> RolloutModelConfig:
        # Otherwise a prompt within the limit still fails in vLLM, and is retried as if it might pass.
        if self.max_prompt_tokens is not None and self.max_prompt_tokens >= self.max_model_len:
            raise ValueError(
                f"max_prompt_tokens ({self.max_prompt_tokens}) must be below max_model_len "
                f"({self.max_model_len}), which also holds the response"
            )
        return self
