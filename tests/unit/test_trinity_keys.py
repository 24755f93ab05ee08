"""The Trinity-RFT key table (`schemas.trinity_keys`): a key Trinity 0.6 does not know is refused by name with
the nearest one it does, several tasksets are refused rather than replaced, and Trinity's length rules settle
`max_model_len` and the prompt and response caps."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.explore import main as explore_main
from schemas.config import DEFAULT_TRAIN, load_config
from schemas.errors import InputError
from schemas.trinity import is_trinity, translate

GSM8K = Path(__file__).with_name("trinity_configs") / "gsm8k_grpo.yaml"
COUNTDOWN = GSM8K.with_name("countdown_explore.yaml")
OPERATOR = {"name": "reward_filter", "args": {"threshold": 0.5}}


def gsm8k() -> dict[str, Any]:
    tree = yaml.safe_load(GSM8K.read_text())
    tree["data_processor"]["experience_pipeline"] = {"operators": [copy.deepcopy(OPERATOR)]}
    tree["explorer"]["over_rollout"] = {"ratio": 0.1}
    tree["explorer"]["dynamic_timeout"] = {"enable": True}
    return tree


def with_key(tree: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """The tree with `value` at the dotted key (list items by index), its sections made where missing."""
    *parents, leaf = dotted.split(".")
    node: Any = tree
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[leaf] = value
    return tree


@pytest.mark.parametrize(
    ("misspelt", "suggestion"),
    [
        ("model.max_respone_tokens", "model.max_response_tokens"),
        ("buffer.batch_szie", "buffer.batch_size"),
        (
            "buffer.explorer_input.defualt_eval_workflow_type",
            "buffer.explorer_input.default_eval_workflow_type",
        ),
        ("buffer.explorer_input.taskset.repeat_time", "buffer.explorer_input.taskset.repeat_times"),
        (
            "buffer.explorer_input.taskset.format.prompt_kye",
            "buffer.explorer_input.taskset.format.prompt_key",
        ),
        (
            "buffer.explorer_input.taskset.rollout_args.temprature",
            "buffer.explorer_input.taskset.rollout_args.temperature",
        ),
        ("buffer.explorer_input.eval_tasksets.0.pth", "buffer.explorer_input.eval_tasksets.0.path"),
        (
            "buffer.trainer_input.experience_buffer.storage_typ",
            "buffer.trainer_input.experience_buffer.storage_type",
        ),
        ("explorer.runner_per_modle", "explorer.runner_per_model"),
        ("explorer.rollout_model.tensor_paralel_size", "explorer.rollout_model.tensor_parallel_size"),
        ("explorer.over_rollout.wait_after_mn", "explorer.over_rollout.wait_after_min"),
        ("explorer.dynamic_timeout.enabel", "explorer.dynamic_timeout.enable"),
        ("synchronizer.sync_intervall", "synchronizer.sync_interval"),
        ("monitor.monitor_tpye", "monitor.monitor_type"),
        ("cluster.ray_adress", "cluster.ray_address"),
        ("data_processor.experience_pipline", "data_processor.experience_pipeline"),
        ("data_processor.experience_pipeline.operator", "data_processor.experience_pipeline.operators"),
        (
            "data_processor.experience_pipeline.operators.0.arg",
            "data_processor.experience_pipeline.operators.0.args",
        ),
        ("algorithm.repeat_time", "algorithm.repeat_times"),
        ("trainer.save_intervl", "trainer.save_interval"),  # a trainer-side section: ignored, still checked
        ("synchroniser", "synchronizer"),  # an unknown top-level section
    ],
)
def test_a_misspelt_key_is_refused_by_name_with_the_nearest_known_one(trinity_env, misspelt, suggestion):
    tree = with_key(gsm8k(), misspelt, 1)
    with pytest.raises(InputError) as info:
        translate(tree, "t.yaml")
    assert info.value.field == misspelt
    assert "not a key of Trinity-RFT 0.6's config" in str(info.value)
    assert f"did you mean {suggestion}?" in str(info.value)


def test_an_unknown_key_with_nothing_close_is_refused_without_a_suggestion(trinity_env):
    with pytest.raises(InputError) as info:
        translate(with_key(gsm8k(), "zzz", {}), "t.yaml")
    assert info.value.field == "zzz" and "did you mean" not in str(info.value)


def test_free_form_dicts_pass_through_unchecked(trinity_env):
    tree = gsm8k()
    taskset = tree["buffer"]["explorer_input"]["taskset"]
    taskset.update(workflow_args={"any": {"nested": 1}}, reward_fn_args={"whatever": True})
    taskset["data_selector"] = {"selector_type": "sequential", "kwargs": {"free": 1}}
    out, _ = translate(tree, "t.yaml")
    translated = out["buffer"]["explorer_input"]["taskset"]
    assert translated["workflow_args"] == {"any": {"nested": 1}}
    assert translated["reward_fn_args"] == {"whatever": True}


def test_several_tasksets_translate_with_their_selectors_and_a_selector_rftflow_lacks_is_refused(
    trinity_env, capsys
):
    tree = yaml.safe_load(COUNTDOWN.read_text())
    inputs = tree["buffer"]["explorer_input"]
    first = dict(inputs.pop("taskset"), name="first")
    second = {
        "name": "mine",
        "path": str(DEFAULT_TRAIN),
        "task_selector": {"selector_type": "random", "seed": 5},
    }
    inputs["tasksets"] = [first, second]
    config = trinity_env / "tasksets.yaml"
    config.write_text(yaml.safe_dump(tree))
    tasksets = load_config(config).buffer.explorer_input.tasksets
    assert [t.name for t in tasksets] == ["first", "mine"]
    assert tasksets[1].data_selector.selector_type == "random" and tasksets[1].data_selector.seed == 5
    second["data_selector"] = {"selector_type": "my_plugin_selector"}
    del second["task_selector"]
    config.write_text(yaml.safe_dump(tree))
    with pytest.raises(InputError) as info:
        load_config(config)
    assert info.value.field == "buffer.explorer_input.tasksets.1.data_selector.selector_type"
    assert "'my_plugin_selector'" in str(info.value)
    assert explore_main(["--config", str(config), "--dry-run"]) == 2
    assert "my_plugin_selector" in capsys.readouterr().err
    assert is_trinity({"buffer": {"explorer_input": {"tasksets": [{"storage_type": "file"}]}}})
    assert not is_trinity({"buffer": {"explorer_input": {"tasksets": [{"name": "a"}]}}})  # rftflow's own


def test_a_misspelt_rollout_model_key_is_not_called_a_vllm_option(trinity_env, caplog):
    tree = with_key(gsm8k(), "explorer.rollout_model.tensor_paralel_size", 2)
    with caplog.at_level(logging.INFO), pytest.raises(InputError):
        translate(tree, "t.yaml")
    assert "tensor_paralel_size: ignored" not in caplog.text


def lengths(model: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(max_model_len, max_prompt_tokens, max_tokens) a config with this `model` section translates to."""
    tree = {"mode": "explore", "model": {"model_path": "m", **model}, "buffer": {"explorer_input": {}}}
    tree["buffer"]["explorer_input"]["taskset"] = {"name": "t", "path": "p"}
    out, _ = translate(tree, "t.yaml")
    rollout = out.get("explorer", {}).get("rollout_model", {})
    taskset = out["buffer"]["explorer_input"]["taskset"]
    return (
        rollout.get("max_model_len"),
        rollout.get("max_prompt_tokens"),
        taskset.get("rollout_args", {}).get("max_tokens"),
    )


@pytest.mark.parametrize(
    ("model", "settled"),
    [
        # max_model_len unset: prompt + response (Trinity's ALFWorld-style settings)
        ({"max_prompt_tokens": 10240, "max_response_tokens": 4096}, (14336, 10240, 4096)),
        # neither cap: each gets half
        ({"max_model_len": 1001}, (1001, 500, 501)),
        # only the response: clamped below the length, the prompt gets the rest
        ({"max_model_len": 1000, "max_response_tokens": 100}, (1000, 900, 100)),
        ({"max_model_len": 1000, "max_response_tokens": 5000}, (1000, 1, 999)),
        # only the prompt: the same, the other way round
        ({"max_model_len": 1000, "max_prompt_tokens": 300}, (1000, 300, 700)),
        # all three, consistent: as given
        ({"max_model_len": 1000, "max_prompt_tokens": 300, "max_response_tokens": 200}, (1000, 300, 200)),
        # no length and only one cap (Trinity refuses): rftflow's default length, the cap as given
        ({"max_response_tokens": 12}, (None, None, 12)),
    ],
)
def test_trinity_length_rules(model, settled):
    assert lengths(model) == settled


def test_caps_over_the_length_are_refused_as_trinity_does():
    with pytest.raises(InputError) as info:
        lengths({"max_model_len": 100, "max_prompt_tokens": 80, "max_response_tokens": 40})
    assert info.value.field == "model.max_model_len" and "(80 + 40)" in str(info.value)


def test_alfworld_style_lengths_translate_and_validate(trinity_env, capsys):
    tree = yaml.safe_load(GSM8K.read_text())
    tree["model"] = {"model_path": "${oc.env:TRINITY_MODEL_PATH}", "max_prompt_tokens": 10240}
    tree["model"]["max_response_tokens"] = 4096
    config = trinity_env / "alfworld.yaml"
    config.write_text(yaml.safe_dump(tree))
    cfg = load_config(config)
    rollout = cfg.explorer.rollout_model
    assert (rollout.max_model_len, rollout.max_prompt_tokens) == (14336, 10240)
    assert cfg.buffer.explorer_input.taskset.rollout_args.max_tokens == 4096
    # the dry run gets past the config to the model: the bundled tiny one has 256 positions only
    assert explore_main(["--config", str(config), "--dry-run"]) == 2
    assert "more than the model's 256 positions" in capsys.readouterr().err


def test_the_configs_in_the_tests_settle_their_lengths_by_the_rules(trinity_env):
    gsm8k_rollout = load_config(GSM8K).explorer.rollout_model  # max_model_len 256, response 64
    assert (gsm8k_rollout.max_model_len, gsm8k_rollout.max_prompt_tokens) == (256, 192)
    countdown_rollout = load_config(COUNTDOWN).explorer.rollout_model  # prompt 64, response 32
    assert (countdown_rollout.max_model_len, countdown_rollout.max_prompt_tokens) == (96, 64)
