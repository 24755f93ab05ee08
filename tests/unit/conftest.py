"""Fixtures for the unit tests (no Ray, no vLLM)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from safetensors.torch import load_file

from operators.engine.checkpoints import TensorMetaMap, tensor_meta
from operators.ops import registry as op_registry
from operators.rollout import reward_registry
from operators.workflows import base as workflow_registry
from schemas.config import DEFAULT_MODEL, DEFAULT_TRAIN


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[..., Path]:
    """Write records (dicts, or raw str lines) as a jsonl file under tmp_path and return its path."""

    def write(records: list[Any], name: str = "tasks.jsonl") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
        path.write_text("".join(line + "\n" for line in lines))
        return path

    return write


@pytest.fixture(scope="session")
def base_tensors() -> dict[str, torch.Tensor]:
    """The tiny model's own tensors (read once; tests copy before changing them)."""
    return load_file(str(DEFAULT_MODEL / "model.safetensors"))


@pytest.fixture(scope="session")
def expected() -> TensorMetaMap:
    """The tiny model's tensor names, shapes and dtypes: what a checkpoint of it must hold."""
    return tensor_meta(DEFAULT_MODEL)


def vllm_processes() -> set[str]:
    """This process's descendants that belong to vLLM (its engine core names itself `VLLM::EngineCore`)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            title = " ".join([child.name(), *child.cmdline()])
        except psutil.Error:  # gone meanwhile
            continue
        if "vllm" in title.lower():
            found.add(f"{child.pid} {title[:120]}")
    return found


def ray_is_up() -> bool:
    ray = sys.modules.get("ray")  # never imported here: a unit test that never touched Ray leaves it out
    return ray is not None and ray.is_initialized()


@pytest.fixture(autouse=True)
def stays_a_unit_test() -> Iterator[None]:
    """Fails a unit test after which Ray is initialised or a vLLM process exists: those belong to the engine,
    integration and reliability tiers, which share the session's engines and clusters. A unit test that
    started either would also slow every unit test after it.

    `make test` runs the unit tier first (`tests/conftest.py`), before any shared engine or cluster exists;
    where another tier's session fixtures came first, what they started is not counted against the test."""
    ray_before, vllm_before = ray_is_up(), vllm_processes()
    yield
    if ray_is_up() and not ray_before:
        sys.modules["ray"].shutdown()
        pytest.fail("a unit test initialised Ray: move it to an integration tier", pytrace=False)
    if left := sorted(vllm_processes() - vllm_before):
        pytest.fail(f"a unit test left vLLM processes: {left}; move it to the engine tier", pytrace=False)


@pytest.fixture
def scratch_registries(monkeypatch: pytest.MonkeyPatch):
    """Copies of the workflow, reward and op registries (built-ins loaded first), so that what a test's
    plugins register does not leak; plugin modules are dropped afterwards."""
    workflow_registry.load_builtins()
    op_registry.load_builtins()
    reward_registry.get_reward_fn("math_accuracy")  # loads the built-in rewards
    monkeypatch.setattr(workflow_registry, "WORKFLOWS", dict(workflow_registry.WORKFLOWS))
    monkeypatch.setattr(reward_registry, "REWARD_FNS", dict(reward_registry.REWARD_FNS))
    monkeypatch.setattr(op_registry, "OPS", dict(op_registry.OPS))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("rftflow_plugin_"):
            del sys.modules[name]


@pytest.fixture
def trinity_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The environment the Trinity-RFT test configs read (`${oc.env:...}`): the tiny model, the bundled
    taskset, a checkpoint root under tmp_path (returned)."""
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(DEFAULT_MODEL))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(DEFAULT_TRAIN))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpts"))
    return tmp_path
