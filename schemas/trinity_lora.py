"""Trinity-RFT 0.6's LoRA keys (`model.lora_configs`, `model.max_cpu_loras`, `model.fully_sharded_loras`)
becoming rftflow's `model.lora` (`schemas.lora_config`), for the key table in `schemas.trinity_model_keys`.

Trinity allows one adapter, as rftflow does. Its defaults for an entry's keys apply where the entry leaves
them out (rank 32, alpha 32, every linear layer), and the engines serve the smallest rank vLLM offers that
holds the adapter's, as Trinity sets `max_lora_rank` from `lora_rank`.
"""

from __future__ import annotations

from typing import Any

from schemas.trinity_rules import Translation

# an entry's keys in Trinity 0.6 (its `LoRAConfig`), with the defaults it gives them
ENTRY_DEFAULTS: dict[str, Any] = {
    "name": None,
    "path": None,
    "base_model_name": None,
    "lora_rank": 32,
    "lora_alpha": 32,
    "lora_dtype": "auto",
    "target_modules": "all-linear",
    "exclude_modules": None,
}
SERVED_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's `max_lora_rank` values


def adapter(value: Any, t: Translation, where: str) -> dict[str, Any] | None:
    """The one entry of `lora_configs` as `model.lora`; an empty list is no adapter."""
    if not isinstance(value, list):
        t.refuse(where, f"expected a list, got {type(value).__name__}")
    if not value:
        return None
    if len(value) > 1:
        t.refuse(where, f"{len(value)} adapters: Trinity-RFT and rftflow run one")
    entry = value[0]
    if not isinstance(entry, dict):
        t.refuse(f"{where}.0", f"expected a mapping of keys, got {type(entry).__name__}")
    t.check_keys(entry, ENTRY_DEFAULTS, f"{where}.0")
    out = {k: entry[k] if entry.get(k) is not None else v for k, v in ENTRY_DEFAULTS.items()}
    rank = out["lora_rank"]
    if not isinstance(rank, int) or not 1 <= rank <= SERVED_RANKS[-1]:
        t.refuse(f"{where}.0.lora_rank", f"a rank from 1 to {SERVED_RANKS[-1]}, got {rank!r}")
    out["max_lora_rank"] = next(r for r in SERVED_RANKS if r >= rank)
    return {k: v for k, v in out.items() if v is not None}


def with_adapter(value: Any, t: Translation, where: str) -> Any:
    """An engine setting for adapters: kept when `lora_configs` names one, else ignored with a notice.
    Trinity's -1 for `max_cpu_loras` is vLLM's default, which rftflow sizes itself."""
    if not t.get("model.lora_configs"):
        t.notice(f"{where}: ignored (no adapter in model.lora_configs)")
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return None
    return value


def engine_dtype(t: Translation, where: str) -> str:
    """Trinity's default engine dtype, bfloat16, except in a LoRA run: the delivery probe needs float32."""
    if t.get("model.lora_configs"):
        t.notice(f"{where}: float32, which a LoRA run's delivery probe needs (Trinity's default is bfloat16)")
        return "float32"
    return "bfloat16"
