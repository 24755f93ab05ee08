"""Trinity-RFT configs, recognised by their keys and translated to rftflow's (`schemas.trinity`), and a
Trinity-RFT trainer's checkpoint layout in checkpoint sync and the bench."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml

from operators.engine.checkpoints import find_checkpoints, tensor_meta
from pipelines.bench import main as bench_main
from pipelines.benchmark.selection import check_candidate, select_candidates
from pipelines.control.weight_sync import CheckpointSource
from pipelines.explore import main as explore_main
from schemas.config import DEFAULT_MODEL, DEFAULT_TRAIN, flatten, load_config
from schemas.errors import InputError
from schemas.trinity import is_trinity

GSM8K = Path(__file__).with_name("trinity_configs") / "gsm8k_grpo.yaml"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_gsm8k" / "gsm8k.yaml"  # the README's
COUNTDOWN = GSM8K.with_name("countdown_explore.yaml")


def variant(tmp_path: Path, **changes) -> Path:
    """The GSM8K config with top-level sections replaced (None drops one)."""
    tree = yaml.safe_load(GSM8K.read_text())
    for key, value in changes.items():
        if value is None:
            tree.pop(key, None)
        else:
            tree[key] = value
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_the_shipped_example_translates_onto_the_bundled_model_and_taskset(monkeypatch):
    for name in ("TRINITY_MODEL_PATH", "TRINITY_TASKSET_PATH", "TRINITY_CHECKPOINT_ROOT_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(EXAMPLE.parents[2])  # Trinity's rule: relative to the working directory, the checkout
    assert is_trinity(yaml.safe_load(EXAMPLE.read_text()))
    cfg = load_config(EXAMPLE, [])
    assert Path(cfg.model.model_path).resolve() == DEFAULT_MODEL.resolve()
    assert Path(cfg.buffer.explorer_input.taskset.path).resolve() == DEFAULT_TRAIN.resolve()
    assert cfg.buffer.explorer_input.taskset.repeat_times == 4 and cfg.synchronizer.sync_timeout == 10


def test_every_explorer_side_key_maps_to_its_meaning(trinity_env, caplog):
    with caplog.at_level(logging.INFO, logger="schemas.config"):
        cfg = load_config(GSM8K)
    taskset = cfg.buffer.explorer_input.taskset
    assert (cfg.project, cfg.name, cfg.model.model_path) == ("Trinity-RFT-gsm8k", "grpo-gsm8k", DEFAULT_MODEL)
    assert taskset.path == DEFAULT_TRAIN and taskset.format.prompt_key == "prompt"
    assert taskset.repeat_times == 8  # algorithm.repeat_times
    assert taskset.rollout_args.max_tokens == 64  # model.max_response_tokens
    assert taskset.rollout_args.temperature == 0.9 and taskset.rollout_args.top_p == 0.95
    assert (taskset.default_workflow_type, taskset.default_reward_fn_type) == ("math", "math_accuracy")
    [eval_set] = cfg.buffer.explorer_input.eval_tasksets
    assert eval_set.path == DEFAULT_TRAIN and eval_set.repeat_times == 1  # ${a.b}; Trinity-RFT's eval default
    assert eval_set.default_workflow_type == "math_boxed"
    rollout = cfg.explorer.rollout_model
    assert (rollout.max_model_len, rollout.engine_num, rollout.dtype, rollout.seed) == (
        256,
        2,
        "bfloat16",
        42,
    )
    assert cfg.explorer.max_timeout == 1800 and cfg.explorer.runner_per_model == 8  # Trinity-RFT's default
    assert cfg.synchronizer.sync_method == "checkpoint"  # nccl, with only the explorer running here
    assert cfg.synchronizer.sync_style == "dynamic_by_trainer" and cfg.synchronizer.sync_timeout == 3600
    assert cfg.synchronizer.checkpoint_dir == trinity_env / "ckpts" / "Trinity-RFT-gsm8k" / "grpo-gsm8k"
    buffer = cfg.buffer.trainer_input.experience_buffer
    assert (buffer.storage_type, buffer.name) == ("sql", "gsm8k_buffer")
    assert buffer.path == f"sqlite:///{trinity_env / 'ckpts'}/gsm8k.db"
    assert cfg.monitor.mlflow_uri == "sqlite:////tmp/trinity-mlflow.db"
    notices = caplog.text
    ignored = [
        "trainer",
        "algorithm.optimizer",
        "cluster.gpu_per_node",
        "buffer.train_batch_size",
        "explorer.rollout_model.enable_prefix_caching",
        "data_processor.task_pipeline",
    ]
    assert all(f"{key}: ignored" in notices for key in ignored) and "mode both" in notices


def test_the_keys_the_gsm8k_config_leaves_out_map_too(trinity_env, caplog):
    with caplog.at_level(logging.INFO, logger="schemas.config"):
        cfg = load_config(COUNTDOWN)
    taskset = cfg.buffer.explorer_input.taskset
    assert cfg.mode == "explore" and cfg.ray.address == "10.0.0.1:6379"
    assert (cfg.buffer.batch_size, cfg.buffer.total_epochs, taskset.repeat_times) == (4, 2, 4)
    assert (taskset.rollout_args.max_tokens, taskset.rollout_args.top_k) == (32, 20)
    assert (taskset.default_workflow_type, taskset.default_reward_fn_type) == ("math", "countdown")
    assert taskset.workflow_args == {"system_prompt": "Reach the target."}
    rollout = cfg.explorer.rollout_model
    assert rollout.max_prompt_tokens == 64 and rollout.gpu_memory_utilization == 0.5
    assert rollout.enable_openai_api and rollout.tool_call_parser == "hermes"
    assert (cfg.explorer.runner_per_model, cfg.explorer.max_retry_times) == (2, 1)
    assert not cfg.explorer.eval_on_startup
    sync = cfg.synchronizer
    assert (sync.sync_method, sync.sync_style, sync.sync_interval, sync.sync_offset) == (
        "memory",
        "dynamic_by_explorer",
        2,
        1,
    )
    assert cfg.buffer.trainer_input.experience_buffer.storage_type == "parquet"  # storage_type file
    notices = caplog.text
    for key in (
        "algorithm.kl_loss_fn",
        "cluster.node_num",
        "model.enable_prompt_truncation",
        "explorer.rollout_model.enable_thinking",
        "buffer.explorer_input.taskset.enable_progress_bar",
        "service",
    ):
        assert f"{key}: ignored" in notices, key
    assert "monitor.monitor_type wandb: rftflow tracks in MLflow" in notices


def test_an_unset_variable_with_a_default_takes_it_and_one_without_is_named(trinity_env, monkeypatch):
    monkeypatch.delenv("TRINITY_CHECKPOINT_ROOT_DIR")
    cfg = load_config(GSM8K)
    # a Trinity-RFT config's relative path is the working directory's, as in Trinity (schemas.config_paths)
    assert cfg.synchronizer.checkpoint_dir == Path.cwd() / "checkpoints/Trinity-RFT-gsm8k/grpo-gsm8k"
    monkeypatch.delenv("TRINITY_MODEL_PATH")
    with pytest.raises(InputError) as info:
        load_config(GSM8K)
    assert "TRINITY_MODEL_PATH" in str(info.value) and info.value.file == str(GSM8K)
    assert info.value.field == "model.model_path"


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [
        ({"mode": "train"}, "mode", "not an explorer run"),
        ({"mode": "serve"}, "serve", "explorer.listen_address"),  # Trinity's 0.0.0.0 default, no key
        ({"mode": "colocate"}, "mode", "not an explorer run"),
        ({"model": {"model_path": "m", "tinker": {"enable": True}}}, "model.tinker", "Tinker"),
        ({"model": {"model_path": "m", "external_model": "gpt"}}, "model.external_model", "external"),
        (
            {"model": {"model_path": "m", "custom_chat_template": "{{x}}"}},
            "model.custom_chat_template",
            "chat",
        ),
        ({"synchronizer": {"sync_method": "telepathy"}}, "synchronizer.sync_method", "unknown method"),
        ({"model": {"model_path": "m", "lora_configs": [{}, {}]}}, "model.lora_configs", "2 adapters"),
        (
            {"explorer": {"auxiliary_models": [{"model_path": "judge"}]}},
            "explorer.auxiliary_models",
            "auxiliary",
        ),
        (
            {"data_processor": {"experience_pipeline": {"operators": [{"name": "reward_shaping_mapper"}]}}},
            "data_processor.experience_pipeline.operators.0",
            "'reward_shaping_mapper' changes what is written",
        ),
        (
            {
                "data_processor": {
                    "experience_pipeline": {"operators": [{"name": "reward_filter", "args": {"x": 1}}]}
                }
            },
            "data_processor.experience_pipeline.operators.0.args",
            "reward_filter arguments ['x']",
        ),
    ],
)
def test_explorer_features_rftflow_lacks_are_refused_naming_the_key(trinity_env, changes, key, fragment):
    with pytest.raises(InputError) as info:
        load_config(variant(trinity_env, **changes))
    assert info.value.field == key and fragment in str(info.value)


def test_over_rollout_and_dynamic_timeout_carry_over_by_sub_key(trinity_env, caplog):
    tree = yaml.safe_load(GSM8K.read_text())
    tree["explorer"]["over_rollout"] = {"ratio": 0.25, "wait_after_min": 3.0}
    tree["explorer"]["dynamic_timeout"] = {"enable": True, "ratio": 4.0, "warmup_min_steps": 2}
    path = trinity_env / "tail.yaml"
    path.write_text(yaml.safe_dump(tree))
    with caplog.at_level(logging.INFO, logger="schemas.config"):
        explorer = load_config(path).explorer
    assert (explorer.over_rollout.ratio, explorer.over_rollout.wait_after_min) == (0.25, 3.0)
    assert explorer.dynamic_timeout.enable and explorer.dynamic_timeout.ratio == 4.0
    assert "explorer.dynamic_timeout.warmup_min_steps: ignored (counted in steps there" in caplog.text


def test_the_reference_reward_filters_become_experience_ops(trinity_env):
    operators = [
        {"name": "reward_filter", "args": {"threshold": 0.5}},
        {"name": "reward_std_filter"},
    ]
    cfg = load_config(variant(trinity_env, data_processor={"experience_pipeline": {"operators": operators}}))
    ops = [op.model_dump() for op in cfg.buffer.explorer_input.experience_ops]
    assert ops == [
        {"name": "reward_filter", "args": {"min_reward": 0.5}},  # Trinity-RFT keeps reward >= threshold
        {"name": "reward_std_filter", "args": {"threshold": 0.0}},  # and groups whose std is above it
    ]


def test_mode_bench_is_kept_for_the_explore_command_to_benchmark(trinity_env):
    assert load_config(variant(trinity_env, mode="bench")).mode == "bench"
    assert load_config(GSM8K).mode == "explore"  # both: the explorer side runs here


def test_a_dataset_subset_and_split_pass_through_to_the_taskset(trinity_env):
    tree = yaml.safe_load(GSM8K.read_text())
    tree["buffer"]["explorer_input"]["taskset"].update(subset_name="main", split="test")
    path = trinity_env / "split.yaml"
    path.write_text(yaml.safe_dump(tree))
    taskset = load_config(path).buffer.explorer_input.taskset
    assert (taskset.subset_name, taskset.split) == ("main", "test")


def test_environment_values_are_saved_and_shown_as_their_references(trinity_env, capsys):
    cfg = load_config(GSM8K)
    assert cfg.model.model_path == DEFAULT_MODEL  # the run uses the value
    shown = yaml.safe_dump(cfg.public_dump())
    assert "${oc.env:TRINITY_MODEL_PATH}" in shown and str(DEFAULT_MODEL) not in shown
    # a value inside a longer one (the checkpoint dir under the root) is hidden too
    assert cfg.public_dump()["synchronizer"]["checkpoint_dir"] == (
        "${oc.env:TRINITY_CHECKPOINT_ROOT_DIR}/Trinity-RFT-gsm8k/grpo-gsm8k"
    )
    assert flatten(cfg)["model.model_path"] == "${oc.env:TRINITY_MODEL_PATH}"  # the MLflow params
    saved = trinity_env / "config.yaml"
    saved.write_text(shown)
    again = load_config(saved)  # as a resume or a trainer reads it: resolved from its own environment
    assert again.model.model_path == DEFAULT_MODEL and again.env_values == cfg.env_values
    assert explore_main(["--config", str(GSM8K), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "${oc.env:TRINITY_MODEL_PATH}" in out and str(DEFAULT_MODEL) not in out


def test_native_configs_are_not_taken_for_trinity_ones():
    assert not is_trinity({"buffer": {"trainer_input": {"experience_buffer": {"storage_type": "sql"}}}})
    assert not is_trinity({"model": {"model_path": "m"}, "synchronizer": {"sync_method": "checkpoint"}})
    assert not is_trinity({"mode": "bench"})  # rftflow's own configs have a mode too
    assert is_trinity({"mode": "both", "algorithm": {}}) and is_trinity({"model": {"max_response_tokens": 8}})
    native = load_config(
        None, ["buffer.explorer_input.taskset.workflow_args={prompt: '${not.interpolated}'}"]
    )
    assert native.buffer.explorer_input.taskset.workflow_args == {"prompt": "${not.interpolated}"}


# -- a Trinity-RFT trainer's checkpoints ------------------------------------------------------------------


@pytest.fixture
def trinity_checkpoints(tmp_path) -> Path:
    """`global_step_N/actor/huggingface/` for N = 2, 4, 6, with `latest_state_dict_iteration.txt` at 4 (step
    6 is still being written)."""
    root = tmp_path / "checkpoints" / "project" / "name"
    for step in (2, 4, 6):
        shutil.copytree(DEFAULT_MODEL, root / f"global_step_{step}" / "actor" / "huggingface")
    (root / "latest_state_dict_iteration.txt").write_text("4\n")
    return root


def test_checkpoint_sync_reads_the_trinity_layout_up_to_its_latest_marker(trinity_checkpoints):
    found = find_checkpoints(trinity_checkpoints)
    assert found == [(n, trinity_checkpoints / f"global_step_{n}" / "actor" / "huggingface") for n in (2, 4)]
    source = CheckpointSource(trinity_checkpoints, tensor_meta(DEFAULT_MODEL))
    assert source.latest_version() == 4  # checked whole: headers, shapes, inside the checkpoint dir
    update = source.next_update(2, timeout=0.1)
    assert update.version == 4 and update.path == found[1][1]


def test_bench_reads_the_trinity_layout_by_folder_and_by_step_path(trinity_checkpoints):
    by_dir = select_candidates(checkpoint_dir=trinity_checkpoints)
    assert [(c.step, c.path.parts[-2:]) for c in by_dir] == [
        (2, ("actor", "huggingface")),
        (4, ("actor", "huggingface")),
    ]
    listed = select_candidates([trinity_checkpoints / "global_step_6"])
    assert [(c.step, c.path) for c in listed] == [
        (6, trinity_checkpoints / "global_step_6" / "actor" / "huggingface")
    ]
    check_candidate(listed[0], tensor_meta(DEFAULT_MODEL), DEFAULT_MODEL)


# -- --dry-run ----------------------------------------------------------------------------------------------


def test_explore_dry_run_checks_everything_prints_the_config_and_writes_nothing(trinity_env, capsys):
    run_dir = trinity_env / "run"
    assert explore_main(["--config", str(GSM8K), "--run-dir", str(run_dir), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "max_tokens: 64\n" in out and "repeat_times: 8\n" in out  # as translated
    assert "batch_timeout: null  # default" in out  # left at its default, marked
    assert "would start afresh" in out and not run_dir.exists()


def test_explore_dry_run_on_a_bad_config_exits_2_with_the_located_message(trinity_env, capsys):
    bad = variant(trinity_env, mode="colocate")
    assert explore_main(["--config", str(bad), "--dry-run"]) == 2
    assert f"error: {bad}, field 'mode'" in capsys.readouterr().err


def test_bench_dry_run_says_what_each_checkpoint_would_do(trinity_checkpoints, tmp_path, capsys):
    broken = trinity_checkpoints / "global_step_2" / "actor" / "huggingface" / "model.safetensors"
    broken.write_bytes(broken.read_bytes()[:100])
    run_dir = tmp_path / "bench"
    code = bench_main(["--checkpoint-dir", str(trinity_checkpoints), "--run-dir", str(run_dir), "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and not run_dir.exists()
    assert "global_step_2: would fail" in out and "global_step_4: would be measured" in out
