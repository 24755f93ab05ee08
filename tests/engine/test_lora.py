"""LoRA on the real engine (vLLM's CPU backend, `PunicaWrapperCPU`) with the tiny tool model: requests sample
under the run's current adapter, by every route; each version is loaded under its own name and proven by
its probe; a wrong adapter fails its load and leaves the old version current; old versions are unloaded.

One in-process engine with LoRA enabled serves the module (the session engines run without LoRA); a second,
on the merged weights, is started and stopped inside the one test that needs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file

from operators.engine.adapters import WEIGHTS_FILE, DeliveryError, Probe, check_adapter, distance
from operators.engine.checkpoints import CheckpointError
from operators.engine.peft_adapters import base_model, probe_ids, score_adapter, teacher_forced, write_adapter
from schemas.config import TOOL_MODEL
from schemas.lora_config import LoraConfig

KEY = "lora-test-key"
LORA = LoraConfig(lora_rank=8, lora_alpha=16, max_lora_rank=16, max_cpu_loras=4)


def make_adapter(folder: Path, seed: int) -> Path:
    """A PEFT adapter of the tool model on every linear layer with random B matrices (so it is not the
    base), and its probe."""
    from peft import get_peft_model

    from operators.engine.peft_adapters import peft_config

    torch.manual_seed(seed)
    model = get_peft_model(base_model(TOOL_MODEL), peft_config(LORA))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    write_adapter(model, folder, TOOL_MODEL.name)
    score_adapter(TOOL_MODEL, folder).save(folder)
    return folder


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("adapters")
    return [make_adapter(root / f"global_step_{i}", seed=i) for i in (1, 2, 3)]


@pytest.fixture(scope="module")
def lora_engine(loop):
    from operators.engine.actor import VLLMEngine
    from schemas.engine_config import RolloutModelConfig

    async def start() -> VLLMEngine:
        rollout = RolloutModelConfig(device="cpu", enable_openai_api=True, dtype="float32", api_key=KEY)
        engine = VLLMEngine(
            str(TOOL_MODEL), rollout.model_dump(mode="json"), lora=LORA.model_dump(mode="json")
        )
        await engine.ready()
        return engine

    engine = loop.run_until_complete(start())
    yield engine
    loop.run_until_complete(engine.shutdown())


def probe_dict(folder: Path) -> dict:
    probe = Probe.load(folder)
    return {"token_ids": probe.token_ids, "logprobs": probe.logprobs}


def load(loop, engine, folder: Path, version: int, probe: dict | None = None, keep: int = 2) -> dict:
    return loop.run_until_complete(
        engine.load_adapter(str(folder), version, "lora", probe or probe_dict(folder), keep)
    )


def test_requests_sample_under_the_loaded_adapter_and_match_peft(loop, lora_engine, adapters):
    prompt = probe_ids(TOOL_MODEL)[:12]
    sampling = {"n": 1, "max_tokens": 8, "temperature": 0.0, "logprobs": 0}
    before = loop.run_until_complete(lora_engine.generate(prompt, sampling))
    report = load(loop, lora_engine, adapters[0], 1)
    after = loop.run_until_complete(lora_engine.generate(prompt, sampling))
    assert report["adapter_d"] <= 1e-3 and report["base_d"] >= 10 * report["adapter_d"]
    assert (after["model_version"], lora_engine.current_adapter()) == (1, "lora-v1")
    # the direct route's sampled logprobs are the adapter's, teacher-forced with PEFT in float32
    from peft import PeftModel

    ids = prompt + after["samples"][0]["response_ids"]
    peft = PeftModel.from_pretrained(base_model(TOOL_MODEL), str(adapters[0])).eval()
    expected = teacher_forced(peft, ids)[len(prompt) - 1 :]
    assert distance(after["samples"][0]["logprobs"], expected) <= 1e-3
    assert distance(before["samples"][0]["logprobs"], expected) > 1e-2


def endpoint(loop, engine, path: str, body: dict | None = None, key: str | None = None) -> httpx.Response:
    """One call of the engine's OpenAI API (a GET without a body), under its API key or `key`."""
    url, _, api_key = engine.openai_endpoint()

    async def call() -> httpx.Response:
        headers = {"Authorization": f"Bearer {key or api_key}"}
        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            if body is None:
                return await client.get(f"{url}{path}")
            return await client.post(f"{url}{path}", json=body)

    return loop.run_until_complete(call())


def endpoint_scores(loop, engine, model: str, probe: Probe, key: str | None = None) -> list[float]:
    """The probe's prompt logprobs through `/v1/completions`, the request naming `model`."""
    body = {"model": model, "prompt": probe.token_ids, "max_tokens": 1, "temperature": 0.0}
    body["prompt_logprobs"] = 0
    reply = endpoint(loop, engine, "/completions", body, key)
    reply.raise_for_status()
    steps = reply.json()["choices"][0]["prompt_logprobs"][1:]
    return [step[str(tok)]["logprob"] for step, tok in zip(steps, probe.token_ids[1:], strict=True)]


def test_the_openai_endpoint_samples_under_the_current_adapter(loop, lora_engine, adapters):
    load(loop, lora_engine, adapters[0], 1)
    _, model, _ = lora_engine.openai_endpoint()
    probe = Probe.load(adapters[0])
    assert distance(endpoint_scores(loop, lora_engine, model, probe), probe.logprobs) <= 1e-3


def test_versions_load_under_their_own_names_and_old_ones_are_unloaded(loop, lora_engine, adapters):
    load(loop, lora_engine, adapters[0], 1, keep=2)
    state = load_file(str(adapters[1] / WEIGHTS_FILE))
    config = json.loads((adapters[1] / "adapter_config.json").read_text())
    report = loop.run_until_complete(
        lora_engine.load_adapter_state(state, config, 2, "lora", probe_dict(adapters[1]), 2)
    )
    assert report["adapter_d"] <= 1e-3 and lora_engine.current_adapter() == "lora-v2"
    staged = lora_engine.adapters_loaded[-1][2]
    assert staged is not None and staged.name == "lora-v2" and staged.is_dir()
    load(loop, lora_engine, adapters[2], 3, keep=2)
    assert loop.run_until_complete(lora_engine.loaded_adapters()) == [2, 3]
    load(loop, lora_engine, adapters[0], 4, keep=1)  # the staged folder goes with its version
    assert loop.run_until_complete(lora_engine.loaded_adapters()) == [4] and not staged.exists()


def test_a_wrong_adapter_fails_its_delivery_check_and_the_old_version_stays(loop, lora_engine, adapters):
    load(loop, lora_engine, adapters[0], 5)
    with pytest.raises(DeliveryError, match="lora-v6"):
        load(loop, lora_engine, adapters[1], 6, probe=probe_dict(adapters[2]))
    assert (lora_engine.model_version, lora_engine.current_adapter()) == (5, "lora-v5")
    assert 6 not in loop.run_until_complete(lora_engine.loaded_adapters())


@pytest.mark.parametrize("fault", ["rank", "targets", "base", "config"])
def test_an_adapter_the_model_cannot_take_is_refused_naming_the_file(adapters, tmp_path, fault):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / WEIGHTS_FILE).write_bytes((adapters[0] / WEIGHTS_FILE).read_bytes())
    config = json.loads((adapters[0] / "adapter_config.json").read_text())
    config.update({"rank": {"r": 64}, "targets": {"target_modules": ["wq"]}}.get(fault, {}))
    if fault == "base":
        config["base_model_name_or_path"] = "other-model"
    if fault != "config":
        (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="adapter_config.json"):
        check_adapter(folder, TOOL_MODEL, max_rank=16)


def test_adapter_logprobs_match_the_engine_on_the_merged_weights(loop, lora_engine, adapters, tmp_path):
    """The same engine, its base weights replaced in place by the merged ones (then put back): a second
    engine start would cost a minute on two cores."""
    from peft import PeftModel

    load(loop, lora_engine, adapters[2], 7)
    merged = PeftModel.from_pretrained(base_model(TOOL_MODEL), str(adapters[2])).merge_and_unload()
    merged.save_pretrained(str(tmp_path))
    ids = Probe.load(adapters[2]).token_ids
    under_adapter = loop.run_until_complete(lora_engine.probe_logprobs(ids, lora_engine.adapter))
    base = loop.run_until_complete(lora_engine.probe_logprobs(ids, None))
    assert lora_engine.base_scores  # kept between adapter loads ...
    loop.run_until_complete(lora_engine.load_checkpoint(str(tmp_path), 7))
    assert lora_engine.base_scores == {}  # ... until the base weights change
    try:
        on_merged = loop.run_until_complete(lora_engine.probe_logprobs(ids, None))
    finally:
        loop.run_until_complete(lora_engine.load_checkpoint(str(TOOL_MODEL), 7))
    assert distance(under_adapter, on_merged) <= 1e-3 < distance(base, on_merged)
    assert distance(loop.run_until_complete(lora_engine.probe_logprobs(ids, None)), base) == 0.0


def test_each_loaded_version_is_listed_and_a_call_naming_one_samples_and_records_that_one(
    loop, lora_engine, adapters
):
    load(loop, lora_engine, adapters[0], 8, keep=2)
    load(loop, lora_engine, adapters[1], 9, keep=2)
    _, model, _ = lora_engine.openai_endpoint()
    listed = {card["id"] for card in endpoint(loop, lora_engine, "/models").json()["data"]}
    assert {model, "lora-v8", "lora-v9"} <= listed
    older, current = Probe.load(adapters[0]), Probe.load(adapters[1])
    # the run's model name samples with the current version; a version's own name, with that version
    assert distance(endpoint_scores(loop, lora_engine, model, current), current.logprobs) <= 1e-3
    assert distance(endpoint_scores(loop, lora_engine, "lora-v8", older), older.logprobs) <= 1e-3
    # an agent's call naming the older version is recorded as sampled by it
    session = lora_engine.open_session(8, 10_000, 30.0, 0, ["named version", 0])
    endpoint_scores(loop, lora_engine, "lora-v8", older, key=session)
    [call] = lora_engine.collect_session(session)["calls"]
    assert call["model_version"] == 8 and lora_engine.model_version == 9
    # unloaded versions leave the registry: naming one is vLLM's 404
    load(loop, lora_engine, adapters[2], 10, keep=1)
    listed = {card["id"] for card in endpoint(loop, lora_engine, "/models").json()["data"]}
    assert "lora-v10" in listed and not {"lora-v8", "lora-v9"} & listed
    body = {"model": "lora-v8", "prompt": older.token_ids, "max_tokens": 1}
    assert endpoint(loop, lora_engine, "/completions", body).status_code == 404
