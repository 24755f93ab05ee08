"""vLLM engine arguments from `explorer.rollout_model`: the one place rftflow's engine (and a benchmark's peer
engine) takes them from."""

from __future__ import annotations

from operators.engine.vllm_args import engine_args, engine_env
from operators.engine.vllm_plugin import BUSY_WAIT_ENV
from schemas.engine_config import RolloutModelConfig


def test_cpu_default_has_no_chunked_prefill_and_a_step_holds_a_whole_prompt():
    rollout = RolloutModelConfig(max_model_len=4096, dtype="float32", seed=7, enforce_eager=True)
    args = engine_args(rollout, gpu=False)
    assert args["enable_chunked_prefill"] is False  # vLLM 0.32 on CPU crashes on chunked seeded prefills
    assert args["max_num_batched_tokens"] == 4096
    assert (args["max_model_len"], args["dtype"], args["seed"], args["enforce_eager"]) == (
        4096,
        "float32",
        7,
        True,
    )
    assert engine_args(RolloutModelConfig(max_model_len=256), gpu=False)["max_num_batched_tokens"] == 2048


def test_gpu_default_chunks_and_the_config_wins_either_way():
    assert engine_args(RolloutModelConfig(), gpu=True)["enable_chunked_prefill"] is True
    assert engine_args(RolloutModelConfig(), gpu=True)["max_num_batched_tokens"] is None
    assert engine_args(RolloutModelConfig(enable_chunked_prefill=True), gpu=False)["enable_chunked_prefill"]
    off = engine_args(RolloutModelConfig(enable_chunked_prefill=False, max_model_len=512), gpu=True)
    assert (off["enable_chunked_prefill"], off["max_num_batched_tokens"]) == (False, 2048)


def test_the_engine_core_sleeps_on_cpu_and_spins_on_gpu_unless_the_config_says():
    assert engine_env(RolloutModelConfig(), gpu=False)[BUSY_WAIT_ENV] == "0"
    assert engine_env(RolloutModelConfig(), gpu=True)[BUSY_WAIT_ENV] == "1"
    assert engine_env(RolloutModelConfig(busy_wait=True), gpu=False)[BUSY_WAIT_ENV] == "1"
    assert engine_env(RolloutModelConfig(busy_wait=False), gpu=True)[BUSY_WAIT_ENV] == "0"


def test_json_whitespace_off_holds_structured_outputs_to_compact_json_and_on_leaves_vllms_default():
    assert "structured_outputs_config" not in engine_args(RolloutModelConfig(), gpu=False)
    compact = engine_args(RolloutModelConfig(json_whitespace=False), gpu=False)["structured_outputs_config"]
    assert compact.disable_any_whitespace and compact.backend == "xgrammar"
