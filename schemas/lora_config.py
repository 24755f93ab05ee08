"""`model.lora`: rollouts under a LoRA adapter instead of the whole model (one adapter per run, as Trinity-RFT
allows). The engines start with LoRA enabled; each version the trainer sends is an adapter, loaded under its
own name and folder, checked by the delivery probe (docs/weight-sync.md, LoRA).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from schemas.config_base import GivenPath, Strict

ALL_LINEAR = "all-linear"  # PEFT's name for every linear layer but the output head


class LoraConfig(Strict):
    name: str = Field(
        "lora",
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="the adapter's name; version N is loaded as `<name>-v<N>`",
    )
    path: GivenPath | None = Field(
        None,
        description="a PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`) to start "
        "from; null: a fresh adapter from `lora_rank` and `target_modules`, whose zero-initialised B "
        "matrices make version 0 the base model itself",
    )
    base_model_name: str | None = Field(
        None,
        description="the base model the adapter was made for (null: `model.model_path`); an adapter whose "
        "`base_model_name_or_path` names another model is refused",
    )
    lora_rank: int = Field(16, ge=1, le=512, description="the adapter's rank (a fresh adapter)")
    lora_alpha: int = Field(16, ge=1, le=4096, description="the adapter's alpha (a fresh adapter)")
    lora_dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="vLLM's `lora_dtype`: `auto` (the model's) or a dtype"
    )
    target_modules: list[str] | str = Field(
        ALL_LINEAR,
        description="the layers adapted (a fresh adapter): module names, or `all-linear`",
    )
    exclude_modules: list[str] | str | None = Field(None, description="layers left out (a fresh adapter)")
    max_lora_rank: int = Field(
        16,
        ge=1,
        le=512,
        description="the highest rank the engines serve; an adapter of a higher rank is refused",
    )
    max_cpu_loras: int = Field(
        4,
        ge=2,
        le=1024,
        description="adapters an engine keeps in its CPU cache; at least `synchronizer.max_staleness` + 2",
    )
    fully_sharded_loras: bool = Field(False, description="vLLM's fully sharded LoRA layers (tensor parallel)")

    @field_validator("max_lora_rank")
    @classmethod
    def _vllm_rank(cls, rank: int) -> int:
        # vLLM 0.32 serves only these ranks (its `MaxLoRARanks`)
        allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
        if rank not in allowed:
            raise ValueError(f"vLLM serves max_lora_rank {', '.join(map(str, allowed))}; got {rank}")
        return rank

    @model_validator(mode="after")
    def _rank_served(self) -> LoraConfig:
        if self.path is None and self.lora_rank > self.max_lora_rank:
            raise ValueError(f"lora_rank ({self.lora_rank}) is over max_lora_rank ({self.max_lora_rank})")
        return self

    def kept_versions(self, max_staleness: int | None) -> int:
        """How many adapter versions an engine keeps loaded: the newest and those a step may still commit."""
        return (max_staleness or 0) + 1
