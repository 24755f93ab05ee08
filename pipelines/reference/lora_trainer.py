"""The reference trainer's LoRA mode: the policy is the base model plus a PEFT adapter, and only the adapter
trains; each version is published as an adapter with its delivery probe (`operators.engine.adapters`).

1. The adapter starts as the run's `model.lora` says: from its `path`, or fresh (zero B matrices, so version
   0 is the base model, as the explorer's engines assume).
2. A checkpoint is `global_step_N/` in PEFT's layout plus `adapter_probe.json`, written aside and renamed.
3. In memory, the adapter's tensors go to the Ray object store, announced with its config and probe.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file

from operators.engine.adapters import CONFIG_FILE, WEIGHTS_FILE, adapter_dir
from operators.engine.peft_adapters import peft_config, probe_of, write_adapter
from schemas.lora_config import LoraConfig
from schemas.run_dir import checkpoint_dir_name


def adapted(model: Any, lora: LoraConfig, start: Path | None) -> Any:
    """`model` with the run's adapter: loaded trainable from `start` (a resumed version, or `lora.path`), or
    made fresh from the rank and target modules."""
    if start is not None:
        return PeftModel.from_pretrained(model, str(adapter_dir(start)), is_trainable=True)
    return get_peft_model(model, peft_config(lora))


def write_version(model: Any, root: Path, version: int, base: Path) -> Path:
    """`root/global_step_<version>/`: the adapter and its probe, written aside then renamed into place."""
    final = Path(root) / checkpoint_dir_name(version)
    Path(root).mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    write_adapter(model, aside, base.name)
    probe_of(model, base).save(aside)
    shutil.rmtree(final, ignore_errors=True)
    aside.rename(final)
    return final


def memory_payload(model: Any, base: Path, put: Any) -> dict[str, Any]:
    """What the weight hub announces for a version in memory: `put` stores the tensors (`ray.put`)."""
    with tempfile.TemporaryDirectory(prefix="rftflow-adapter-") as folder:
        write_adapter(model, Path(folder), base.name)
        config = json.loads((Path(folder) / CONFIG_FILE).read_text())
        state = {k: v.to(torch.float32) for k, v in load_file(str(Path(folder) / WEIGHTS_FILE)).items()}
    probe = probe_of(model, base)
    return {
        "kind": "memory",
        "state": [put(state)],
        "adapter": {"config": config, "probe": {"token_ids": probe.token_ids, "logprobs": probe.logprobs}},
    }
