"""Per-request seeds and vLLM sampling parameters, derived from a task's rollout_args."""

from __future__ import annotations

from operators.engine.client import sampling_params
from operators.engine.seeds import derive_seed
from schemas.config import RolloutArgs


def test_derive_seed_is_deterministic_and_specific():
    seed = derive_seed(0, "arith/e0/1", 0)
    assert seed == derive_seed(0, "arith/e0/1", 0)
    assert isinstance(seed, int) and 0 <= seed < 2**31
    others = {
        derive_seed(0, "arith/e0/1", 1),
        derive_seed(1, "arith/e0/1", 0),
        derive_seed(0, "arith/e1/1", 0),
    }
    assert seed not in others and len(others) == 3


def test_derive_seed_without_base_is_random():
    assert derive_seed(None, "arith/e0/1", 0) is None


def test_sampling_params_keep_vllm_fields_and_set_n_and_seed():
    args = RolloutArgs(temperature=0.7, top_p=0.9, top_k=5, max_tokens=12, logprobs=2, seed=11).model_dump()
    params = sampling_params({**args, "unknown": 1}, n=4, seed=99)
    assert params == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "max_tokens": 12,
        "ignore_eos": False,
        "logprobs": 2,
        "n": 4,
        "seed": 99,
    }


def test_sampling_params_leave_unset_fields_to_vllm():
    assert sampling_params({"max_tokens": 3}, n=1, seed=None) == {"max_tokens": 3, "n": 1, "seed": None}
