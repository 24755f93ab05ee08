"""LoRA adapters made and scored with PEFT on the driver (or the trainer): a fresh adapter from the run's
`model.lora`, and the delivery probe of an adapter that came without one (`operators.engine.adapters`).

float32 throughout: the probe is the reference the engines' float32 scores are held to within 1e-3.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from operators.engine.adapters import WEIGHTS_FILE, Probe, adapter_dir

log = logging.getLogger(__name__)
PROBE_TEXT = "The probe: 12 + 30 = 42, and 7 * 6 = 42. A quick brown fox jumps over the lazy dog."
PROBE_TOKENS = 48


def probe_ids(model_dir: Path) -> list[int]:
    """The fixed sequence every adapter of this base model is probed with."""
    from transformers import AutoTokenizer  # heavy, deferred: only the driver and trainer score adapters

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return list(tokenizer.encode(PROBE_TEXT, add_special_tokens=True))[:PROBE_TOKENS]


def teacher_forced(model: Any, ids: list[int]) -> list[float]:
    """float32 logprob of each token after the first, given those before it."""
    import torch  # heavy, deferred: as above

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]


def base_model(model_dir: Path) -> Any:
    import torch  # heavy, deferred: as above
    from transformers import AutoModelForCausalLM  # heavy, deferred: as above

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def score_adapter(model_dir: Path, adapter: Path) -> Probe:
    """The probe of `adapter` on `model_dir`, computed with PEFT (once per adapter without one)."""
    from peft import PeftModel  # heavy, deferred: as above

    ids = probe_ids(model_dir)
    model = PeftModel.from_pretrained(base_model(model_dir), str(adapter_dir(adapter))).eval()
    return Probe(ids, teacher_forced(model, ids))


def ensure_probe(model_dir: Path, adapter: Path) -> Probe:
    """The probe an adapter carries, else one computed now (not written: a checkpoint is the trainer's)."""
    probe = Probe.load(adapter_dir(adapter))
    if probe is None:
        log.info("adapter %s carries no probe: scoring it with PEFT", adapter)
        probe = score_adapter(model_dir, adapter)
    return probe


def peft_config(lora: Any) -> Any:
    """PEFT's config for the run's `model.lora` (`schemas.lora_config.LoraConfig`)."""
    from peft import LoraConfig  # heavy, deferred: as above

    return LoraConfig(
        r=lora.lora_rank,
        lora_alpha=lora.lora_alpha,
        target_modules=lora.target_modules,
        exclude_modules=lora.exclude_modules,
        task_type="CAUSAL_LM",
    )


def write_adapter(model: Any, folder: Path, base_name: str) -> Path:
    """Save a PEFT model's adapter and its probe into `folder` (PEFT's layout); returns the folder."""
    folder = Path(folder)
    model.save_pretrained(str(folder))
    config = folder / "adapter_config.json"
    raw = json.loads(config.read_text())
    raw["base_model_name_or_path"] = base_name
    config.write_text(json.dumps(raw, indent=2))
    if not (folder / WEIGHTS_FILE).is_file():
        raise RuntimeError(f"{folder}: PEFT wrote no {WEIGHTS_FILE}")
    return folder


def probe_of(model: Any, model_dir: Path) -> Probe:
    """The probe of a PEFT model in memory (the trainer's, after a step)."""
    ids = probe_ids(model_dir)
    was_training = model.training
    model.eval()
    try:
        return Probe(ids, teacher_forced(model, ids))
    finally:
        model.train(was_training)
