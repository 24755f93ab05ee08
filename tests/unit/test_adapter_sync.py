"""A LoRA run's versions on the driver (`pipelines.control.adapter_sync`, `operators.engine.adapters`): what
a checkpoint or a hub announcement becomes, what is refused and why, and that the fleet keeps full weights
and adapters apart. Plain files and data: no Ray, no vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from operators.engine.adapters import (
    PROBE_TOLERANCE,
    DeliveryError,
    Probe,
    adapter_dir,
    check_delivery,
)
from operators.engine.checkpoints import CheckpointError
from pipelines.control.adapter_sync import checkpoint_update, memory_update
from pipelines.control.fleet import EngineFleet, LoadError
from pipelines.control.state import ExplorerState
from pipelines.control.weight_sync import ExplorerSync
from pipelines.control.weight_updates import AdapterSpec, Restore, WeightUpdate
from schemas.config import TOOL_MODEL, validate_tree

PROBE = {"token_ids": [0, 5, 6], "logprobs": [-1.0, -2.0]}
CONFIG = {
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj", "v_proj"],
    "base_model_name_or_path": "tiny-tool-llama",
}


def lora_cfg(**sync):
    tree = {"model": {"model_path": str(TOOL_MODEL), "lora": {"max_cpu_loras": 5}}, "synchronizer": sync}
    tree["explorer"] = {"rollout_model": {"dtype": "float32"}}
    return validate_tree(tree, "c.yaml")


def write(folder: Path, config: dict = CONFIG, probe: dict | None = PROBE) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(
        {"base_model.model.layers.0.q_proj.lora_A.weight": np.zeros((8, 128), np.float32)},
        str(folder / "adapter_model.safetensors"),
    )
    if probe is not None:
        (folder / "adapter_probe.json").write_text(json.dumps(probe))
    return folder


def test_a_peft_checkpoint_becomes_a_versioned_adapter_update_with_its_probe(tmp_path):
    update = checkpoint_update(lora_cfg(max_staleness=2), write(tmp_path / "global_step_3"), 3)
    assert (update.version, update.kind, update.path) == (3, "checkpoint", tmp_path / "global_step_3")
    assert update.adapter == AdapterSpec("lora", PROBE, keep=3)
    assert update.restore_point().adapter == update.adapter  # a replacement comes back on the adapter


def test_trinitys_lora_adapter_folder_inside_the_checkpoint_is_found(tmp_path):
    inner = write(tmp_path / "global_step_2" / "actor" / "lora_adapter")
    assert adapter_dir(tmp_path / "global_step_2") == inner
    assert checkpoint_update(lora_cfg(), tmp_path / "global_step_2", 2).path == inner


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({**CONFIG, "r": 32}, "over max_lora_rank=16"),
        ({**CONFIG, "target_modules": ["wq"]}, "['wq'] are not in the base model"),
        ({**CONFIG, "base_model_name_or_path": "org/other-model"}, "made for base model"),
    ],
)
def test_an_adapter_the_engines_cannot_serve_is_refused_naming_the_file(tmp_path, config, fragment):
    with pytest.raises(CheckpointError, match="adapter_config.json") as info:
        checkpoint_update(lora_cfg(), write(tmp_path / "global_step_1", config), 1)
    assert fragment in str(info.value)


def test_a_checkpoint_without_adapter_config_is_refused(tmp_path):
    (tmp_path / "global_step_1").mkdir()
    with pytest.raises(CheckpointError, match="adapter_config.json: missing"):
        checkpoint_update(lora_cfg(), tmp_path / "global_step_1", 1)


def test_a_hub_announcement_becomes_a_memory_update_and_full_weights_are_refused():
    payload = {"kind": "memory", "state": ["ref"], "adapter": {"config": CONFIG, "probe": PROBE}}
    update = memory_update(lora_cfg(), 4, payload)
    assert (update.kind, update.state, update.adapter.config) == ("memory", "ref", CONFIG)
    with pytest.raises(CheckpointError, match="without its probe"):
        memory_update(lora_cfg(), 4, {"kind": "memory", "state": ["ref"], "meta": []})


def test_the_delivery_check_needs_the_adapters_scores_and_distance_from_the_base():
    probe = Probe([0, 1, 2], [-1.0, -2.0])
    assert check_delivery("a-v1", probe, [-1.0, -2.0005], [-1.5, -2.0])["base_d"] == 0.5
    with pytest.raises(DeliveryError, match="does not sample with the adapter"):
        check_delivery("a-v1", probe, [-1.5, -2.0], [-1.5, -2.0])
    with pytest.raises(DeliveryError, match="cannot be told from the base"):
        check_delivery("a-v1", probe, [-1.0, -2.0 + PROBE_TOLERANCE / 2], [-1.0, -2.0 + PROBE_TOLERANCE])


def test_the_fleet_refuses_to_mix_full_weights_and_adapters():
    lora_fleet = EngineFleet(lora_cfg(), "mix", launch=lambda name, closed: None)
    with pytest.raises(LoadError, match="full weights in a LoRA run"):
        lora_fleet.load(WeightUpdate(1, "checkpoint", path=Path("x")), 1.0)
    full_fleet = EngineFleet(validate_tree({}, "c.yaml"), "mix", launch=lambda name, closed: None)
    with pytest.raises(LoadError, match="an adapter in a full-weight run"):
        full_fleet.load(
            WeightUpdate(1, "checkpoint", path=Path("x"), adapter=AdapterSpec("a", PROBE, 1)), 1.0
        )


def test_the_reference_trainers_adapter_versions_pass_the_explorers_checks(tmp_path):
    """What `pipelines.reference.lora_trainer` publishes is what `adapter_sync` takes, probe included."""
    import torch
    from transformers import AutoModelForCausalLM

    from operators.engine.peft_adapters import score_adapter
    from pipelines.reference.lora_trainer import adapted, memory_payload, write_version

    cfg = lora_cfg()
    model = adapted(
        AutoModelForCausalLM.from_pretrained(TOOL_MODEL, dtype=torch.float32), cfg.model.lora, None
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    update = checkpoint_update(cfg, write_version(model, tmp_path, 1, TOOL_MODEL), 1)
    assert update.path == tmp_path / "global_step_1" and not list(tmp_path.glob(".global_step_1-*"))
    assert update.adapter.probe["logprobs"] == score_adapter(TOOL_MODEL, update.path).logprobs
    announced = memory_update(cfg, 2, memory_payload(model, TOOL_MODEL, lambda state: state))
    assert announced.adapter.probe == update.adapter.probe and announced.state


class LoadRecorder:
    """Stands in for the fleet where a resumed explorer puts its engines back: records what it is asked to
    load and becomes that restore point, as `EngineFleet.load` does."""

    def __init__(self, model_path: Path):
        self.restore_point, self.loads = Restore(0, path=model_path), []

    def load(self, update: WeightUpdate, timeout: float) -> None:
        self.loads.append(update)
        self.restore_point = update.restore_point()


def resumed(tmp_path: Path, reached: int, **lora) -> tuple[LoadRecorder, ExplorerState]:
    """A LoRA run resumed at `reached`, its engines aligned; version 2's adapter is on disk."""
    write(tmp_path / "checkpoints" / "global_step_2")
    cfg = lora_cfg(sync_method="checkpoint", checkpoint_dir=str(tmp_path / "checkpoints"))
    cfg.model.lora = cfg.model.lora.model_copy(update=lora)
    explorer_sync = ExplorerSync(cfg, tmp_path / "run", "resumed")
    explorer_sync.fleet, state = LoadRecorder(TOOL_MODEL), ExplorerState(model_version=reached)
    explorer_sync.align_engines(state)
    return explorer_sync.fleet, state


def test_a_resumed_lora_run_reloads_the_adapter_version_it_reached(tmp_path):
    fleet, state = resumed(tmp_path, 2)
    [update] = fleet.loads
    assert (update.version, update.path, update.adapter.probe) == (
        2,
        tmp_path / "checkpoints/global_step_2",
        PROBE,
    )
    assert fleet.restore_point.adapter == update.adapter and state.model_version == 2


def test_a_resumed_lora_run_whose_version_is_gone_goes_on_from_version_0(tmp_path):
    fleet, state = resumed(tmp_path, 5)  # version 5 is not on disk; a fresh adapter's version 0 is the base
    assert fleet.loads == [] and state.model_version == 0
    fleet, state = resumed(tmp_path / "from-path", 5, path=write(tmp_path / "start"))
    assert [(u.version, u.path) for u in fleet.loads] == [
        (0, tmp_path / "start")
    ] and state.model_version == 0
