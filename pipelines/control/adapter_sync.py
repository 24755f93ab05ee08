"""A LoRA run's versions as the fleet loads them: an adapter checkpoint (PEFT's layout or Trinity-RFT's
`lora_adapter/`) or an adapter handed over in memory, checked against the base model and carrying its
delivery probe (`operators.engine.adapters`). When a checkpoint carries no probe, it is computed here once,
with PEFT on the driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from operators.engine.adapters import Probe, adapter_dir, check_adapter, check_adapter_config
from operators.engine.checkpoints import CheckpointError
from operators.engine.peft_adapters import ensure_probe
from pipelines.control.weight_updates import AdapterSpec, WeightUpdate
from schemas.config import Config
from schemas.errors import InputError


def spec(cfg: Config, probe: Probe, config: dict[str, Any] | None = None) -> AdapterSpec:
    lora = cfg.model.lora
    keep = lora.kept_versions(cfg.synchronizer.max_staleness)
    return AdapterSpec(lora.name, {"token_ids": probe.token_ids, "logprobs": probe.logprobs}, keep, config)


def checkpoint_update(cfg: Config, path: Path, version: int) -> WeightUpdate:
    """Version `version` from an adapter folder, checked, with its probe (CheckpointError naming the file)."""
    lora, base = cfg.model.lora, Path(cfg.model.model_path)
    check_adapter(path, base, lora.max_lora_rank, lora.base_model_name)
    folder = adapter_dir(path)
    return WeightUpdate(version, "checkpoint", path=folder, adapter=spec(cfg, ensure_probe(base, folder)))


def memory_update(cfg: Config, version: int, payload: dict[str, Any]) -> WeightUpdate:
    """Version `version` from a trainer's announcement on the weight hub: `state` (`[ref]` to the adapter's
    tensors) and `adapter` (`config`: PEFT's adapter config; `probe`: its probe)."""
    lora, base = cfg.model.lora, Path(cfg.model.model_path)
    announced = payload.get("adapter")
    where = f"version {version} (weight hub)"
    if not isinstance(announced, dict) or "probe" not in announced:
        raise CheckpointError(f"{where}: full weights, or an adapter without its probe, in a LoRA run")
    check_adapter_config(announced.get("config"), where, base, lora.max_lora_rank, lora.base_model_name)
    probe = Probe(**announced["probe"])
    state = payload.get("state", [None])[0]
    return WeightUpdate(version, "memory", state=state, adapter=spec(cfg, probe, announced["config"]))


def initial_update(cfg: Config) -> WeightUpdate | None:
    """Version 0 of a LoRA run started from `model.lora.path`; None for a fresh adapter, whose zero B
    matrices make version 0 the base model itself."""
    lora = cfg.model.lora
    if lora is None or lora.path is None:
        return None
    if not Path(lora.path).is_dir():
        raise InputError(f"{lora.path}: not an adapter folder", field="model.lora.path")
    return checkpoint_update(cfg, Path(lora.path), 0)
