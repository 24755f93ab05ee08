"""LoRA adapters on disk and the proof that one arrived: where a checkpoint keeps its adapter, the checks an
adapter must pass before any engine sees it, and the delivery check an engine's probe must pass after a load.

The most-reported LoRA failure is an adapter that never reaches the rollout engine, so that rollouts sample
the base policy and it looks like staleness. Every adapter therefore travels with a *probe*: the float32
logprobs of a fixed token sequence under it. After a load the engine scores the same sequence under the new
adapter and under the base model; the load counts only if the adapter's scores are within `PROBE_TOLERANCE`
of the probe and the base's at least `PROBE_MARGIN` times further away.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from operators.engine.checkpoints import CheckpointError, read_header

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PROBE_FILE = "adapter_probe.json"
TRINITY_ADAPTER_DIR = "lora_adapter"  # Trinity-RFT's adapter, inside the actor's checkpoint folder
PROBE_TOLERANCE = 1e-3  # max abs difference, float32 logprobs
PROBE_MARGIN = 10.0  # the base model must be this many times further from the probe than the adapter
ALL_LINEAR = "all-linear"


def lora_id(version: int) -> int:
    """vLLM's id for adapter version `version`: ids must be at least 1, and a run's versions start at 0."""
    return version + 1


def lora_version(lora_id: int) -> int:
    """The adapter version loaded under vLLM's id `lora_id` (the inverse of `lora_id`)."""
    return lora_id - 1


class DeliveryError(RuntimeError):
    """An engine's scores under a new adapter are not the adapter's: the load failed."""


@dataclass
class Probe:
    """A fixed token sequence and its float32 logprobs under one adapter (one per token after the first)."""

    token_ids: list[int]
    logprobs: list[float]

    def save(self, folder: Path) -> None:
        (Path(folder) / PROBE_FILE).write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, folder: Path) -> Probe | None:
        path = Path(folder) / PROBE_FILE
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text())
            return cls([int(i) for i in raw["token_ids"]], [float(x) for x in raw["logprobs"]])
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: not a probe ({exc})") from None


def adapter_dir(step_dir: Path) -> Path:
    """The adapter folder of a checkpoint: PEFT's layout (the folder itself), or Trinity-RFT's
    `lora_adapter/` inside it (or inside its `actor/`)."""
    step_dir = Path(step_dir)
    for candidate in (step_dir, step_dir / TRINITY_ADAPTER_DIR, step_dir / "actor" / TRINITY_ADAPTER_DIR):
        if (candidate / CONFIG_FILE).is_file():
            return candidate
    return step_dir


def module_names(model_dir: Path) -> set[str]:
    """The leaf names of the base model's weight-bearing modules (`q_proj`, `down_proj`, ...)."""
    names: set[str] = set()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for tensor in read_header(path)[0]:
            parts = tensor.split(".")
            if len(parts) >= 2:
                names.add(parts[-2])
    return names


def check_adapter(folder: Path, base_model: Path, max_rank: int, base_name: str | None = None) -> dict:
    """The adapter's config, once it is one this base model's engines can serve; CheckpointError naming the
    file otherwise: no `adapter_config.json`, a rank over `max_rank`, target modules the model lacks, made
    for another base model, or a weights file that is cut short."""
    folder = adapter_dir(folder)
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: missing (a LoRA adapter needs PEFT's adapter_config.json)")
    try:
        config: dict[str, Any] = json.loads(config_path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{config_path}: unreadable ({exc})") from None
    check_adapter_config(config, str(config_path), base_model, max_rank, base_name)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{weights}: missing")
    _, length = read_header(weights)
    if weights.stat().st_size < length:
        raise CheckpointError(f"{weights}: cut short ({weights.stat().st_size} of {length} bytes)")
    return config


def check_adapter_config(
    config: dict[str, Any], where: str, base_model: Path, max_rank: int, base_name: str | None = None
) -> None:
    """PEFT's adapter config (from a file, or handed over in memory) against the run's base model."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{where}: not an adapter config (a {type(config).__name__})")
    rank = config.get("r")
    if not isinstance(rank, int) or rank > max_rank:
        raise CheckpointError(f"{where}: rank r={rank!r} is over max_lora_rank={max_rank}")
    made_for = config.get("base_model_name_or_path")
    wanted = base_name or Path(base_model).name
    if made_for and Path(str(made_for)).name != Path(wanted).name:
        raise CheckpointError(f"{where}: made for base model {made_for!r}, this run's is {wanted!r}")
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        targets = [] if targets == ALL_LINEAR else [targets]
    # PEFT saves `all-linear` resolved, as full module paths: each must end in one of the model's modules
    if missing := sorted(t for t in set(targets) if t.rsplit(".", 1)[-1] not in module_names(base_model)):
        raise CheckpointError(f"{where}: target modules {missing} are not in the base model")


def distance(a: list[float], b: list[float]) -> float:
    """Max abs difference of two logprob lists (inf when their lengths differ)."""
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def check_delivery(name: str, probe: Probe, adapter: list[float], base: list[float]) -> dict[str, float]:
    """The probe's distances (`adapter_d`: engine under the adapter to the probe; `base_d`: engine on the
    base model to the probe), or DeliveryError when they do not prove the adapter arrived."""
    adapter_d, base_d = distance(adapter, probe.logprobs), distance(base, probe.logprobs)
    if adapter_d > PROBE_TOLERANCE:
        raise DeliveryError(
            f"adapter {name}: the engine's probe logprobs are {adapter_d:.3g} from the adapter's "
            f"(tolerance {PROBE_TOLERANCE:g}): it does not sample with the adapter it was sent"
        )
    if base_d < PROBE_MARGIN * adapter_d:
        raise DeliveryError(
            f"adapter {name}: the base model is as close to the probe ({base_d:.3g}) as the adapter is "
            f"({adapter_d:.3g}): its delivery cannot be told from the base model's"
        )
    return {"adapter_d": adapter_d, "base_d": base_d}
