"""`model.lora` and Trinity-RFT's LoRA keys: what a config asks of the adapter, and what it is refused."""

from __future__ import annotations

import pytest

from schemas.config import validate_tree
from schemas.errors import InputError
from schemas.trinity import translate

F32 = {"rollout_model": {"dtype": "float32"}}
ISSUE_ENTRY = {"name": "lora", "lora_rank": 16, "lora_alpha": 32, "target_modules": "all-linear"}


def trinity(model: dict, **more: dict) -> tuple[dict, list[str]]:
    more.setdefault("explorer", {"rollout_model": {"dtype": "float32"}})
    return translate({"mode": "explore", "model": {"model_path": "m", **model}, **more}, "t.yaml")


def test_trinity_lora_configs_translate_to_one_adapter():
    out, _ = trinity({"lora_configs": [ISSUE_ENTRY]})
    lora = validate_tree(out, "t.yaml").model.lora
    assert (lora.name, lora.lora_rank, lora.lora_alpha, lora.target_modules) == ("lora", 16, 32, "all-linear")
    assert lora.path is None and lora.max_lora_rank == 16


def test_the_issues_trinity_config_translates_and_validates_with_float32_engines():
    out, notices = translate(
        {"mode": "explore", "model": {"model_path": "m", "lora_configs": [ISSUE_ENTRY]}}, "t"
    )
    cfg = validate_tree(out, "t.yaml")
    assert (cfg.model.lora.lora_rank, cfg.explorer.rollout_model.dtype) == (16, "float32")
    assert any("float32, which a LoRA run's delivery probe needs" in n for n in notices)


def test_trinity_defaults_fill_an_entry_and_the_served_rank_holds_it():
    out, _ = trinity({"lora_configs": [{"lora_rank": 20}], "max_cpu_loras": 6, "fully_sharded_loras": True})
    lora = out["model"]["lora"]
    assert (lora["lora_alpha"], lora["max_lora_rank"], lora["max_cpu_loras"]) == (32, 32, 6)
    assert lora["fully_sharded_loras"] is True


def test_trinity_minus_one_cpu_loras_is_rftflows_default():
    out, _ = trinity({"lora_configs": [ISSUE_ENTRY], "max_cpu_loras": -1})
    assert "max_cpu_loras" not in out["model"]["lora"]
    assert validate_tree(out, "t.yaml").model.lora.max_cpu_loras == 4


def test_lora_engine_keys_without_an_adapter_are_ignored_with_a_notice():
    out, notices = trinity({"max_cpu_loras": 8})
    assert "lora" not in out["model"]
    assert any("model.max_cpu_loras: ignored (no adapter" in n for n in notices)


@pytest.mark.parametrize(
    ("entry", "key", "fragment"),
    [
        ([ISSUE_ENTRY, ISSUE_ENTRY], "model.lora_configs", "2 adapters"),
        ([{"rank": 8}], "model.lora_configs.0.rank", "did you mean model.lora_configs.0.lora_rank"),
        ([{"lora_rank": 0}], "model.lora_configs.0.lora_rank", "a rank from 1"),
    ],
)
def test_trinity_lora_entries_rftflow_cannot_run_are_refused_by_key(entry, key, fragment):
    with pytest.raises(InputError) as info:
        trinity({"lora_configs": entry})
    assert info.value.field == key and fragment in str(info.value)


def test_runtime_adapter_loading_over_http_is_refused():
    with pytest.raises(InputError, match="HTTP route"):
        trinity({}, explorer={"rollout_model": {"enable_runtime_lora_updating": True}})


@pytest.mark.parametrize(
    ("tree", "field", "fragment"),
    [
        (
            {"model": {"lora": {"max_cpu_loras": 3}}, "synchronizer": {"max_staleness": 2}},
            "model.lora.max_cpu_loras",
            "max_staleness + 2 (4)",
        ),
        (
            {"model": {"lora": {}}, "synchronizer": {"sync_method": "broadcast"}},
            "synchronizer.sync_method",
            "",
        ),
        ({"model": {"lora": {"lora_rank": 32}}}, "model.lora", "over max_lora_rank (16)"),
        ({"model": {"lora": {"max_lora_rank": 12}}}, "model.lora.max_lora_rank", "vLLM serves"),
    ],
)
def test_lora_configs_the_engines_cannot_serve_are_refused(tree, field, fragment):
    with pytest.raises(InputError) as info:
        validate_tree({**tree, "explorer": F32}, "c.yaml")
    assert info.value.field == field and fragment in str(info.value)


def test_a_lora_run_needs_float32_engines_for_its_delivery_probe():
    with pytest.raises(InputError, match="float32") as info:
        validate_tree({"model": {"lora": {}}, "explorer": {"rollout_model": {"dtype": "auto"}}}, "c.yaml")
    assert info.value.field == "explorer.rollout_model.dtype"


def test_kept_versions_follow_max_staleness():
    lora = validate_tree({"model": {"lora": {"max_cpu_loras": 5}}, "explorer": F32}, "c.yaml").model.lora
    assert (lora.kept_versions(None), lora.kept_versions(3)) == (1, 4)
