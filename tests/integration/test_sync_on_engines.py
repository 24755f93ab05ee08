"""Weight sync on the real stack, sharing one engine actor: every source, refusals, timeouts, closed loops."""

from __future__ import annotations

import asyncio
import json
import math
import sys

import pyarrow.parquet as pq
import pytest
import ray
import torch
from integration_settings import BASE
from mlflow import MlflowClient
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from operators.engine.checkpoints import write_checkpoint
from operators.engine.transfer import meta_of, open_group, send
from pipelines.explore import explore
from pipelines.explorer import Explorer
from pipelines.reference.grpo import token_logprobs
from schemas.config import DEFAULT_MODEL, load_config

ENGINE_DTYPE = torch.float32  # BASE sets dtype float32 (under dtype auto vLLM on CPU would use bfloat16)
VOCAB = 277
NORM = "model.norm.weight"
DOWN = "model.layers.1.mlp.down_proj.weight"  # a linear weight: repacked into the CPU kernel
EMBED = "model.embed_tokens.weight"  # tied: the LM head shares it (tie_word_embeddings)
GREEDY = {"max_tokens": 6, "temperature": 0.0, "logprobs": 0}


@pytest.fixture(scope="module")
def base_state() -> dict[str, torch.Tensor]:
    return load_file(str(DEFAULT_MODEL / "model.safetensors"))


def generate(engines, prompt: str = "12+7=") -> dict:
    return ray.get(engines.handles[0].generate.remote(prompt, GREEDY))


def scored_by_transformers(model_dir, prompt_ids: list[int], response_ids: list[int]) -> list[float]:
    """Each response token's logprob under the checkpoint in `model_dir`, as the reference trainer scores it
    (Transformers)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logprobs = token_logprobs(model, ids, torch.ones_like(ids))
    return logprobs[0, len(prompt_ids) :].tolist()


def flat_logits(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The final norm zeroed: every logit is 0, so every sampled token has logprob -ln(vocab)."""
    return {**state, NORM: torch.zeros_like(state[NORM])}


class Session:
    """An `Explorer` on the shared engines, driven step by step on one event loop."""

    def __init__(self, engines, tmp_path, *overrides: str):
        cfg = load_config(None, [*BASE, "buffer.total_steps=2", *overrides])
        self.loop = asyncio.new_event_loop()
        self.explorer = Explorer(cfg, tmp_path / "run", engines=engines, progress=False)
        self.run(self.explorer.prepare())

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def weight(self, name: str) -> torch.Tensor:
        return self.run(self.explorer.get_weight(name))

    def close(self) -> None:
        self.run(self.explorer.shutdown())
        self.loop.close()


@pytest.fixture
def checkpoint_session(engines, tmp_path):
    """Checkpoint sync with room to load on a loaded machine (`sync_timeout` bounds the load too)."""
    session = Session(
        engines, tmp_path, "synchronizer.sync_method=checkpoint", "synchronizer.sync_timeout=120"
    )
    yield session
    session.close()


def test_checkpoint_sync_loads_new_weights_and_generation_follows(engines, base_state, checkpoint_session):
    explorer = checkpoint_session.explorer
    before = generate(engines)
    assert before["model_version"] == 0
    scaled = {**base_state, DOWN: base_state[DOWN] * 1.5}
    write_checkpoint(explorer.checkpoint_dir, 1, flat_logits(scaled), DEFAULT_MODEL)

    outcome = checkpoint_session.run(explorer.sync_weight())
    assert outcome.ok and outcome.version == 1 and outcome.nbytes > 0
    assert torch.equal(checkpoint_session.weight(DOWN), scaled[DOWN].to(ENGINE_DTYPE))
    assert torch.equal(checkpoint_session.weight(NORM), torch.zeros(128, dtype=ENGINE_DTYPE))
    flat = generate(engines)
    assert flat["model_version"] == 1
    for sample in flat["samples"]:
        assert sample["logprobs"] == pytest.approx([-math.log(VOCAB)] * len(sample["logprobs"]), abs=1e-3)

    write_checkpoint(explorer.checkpoint_dir, 2, base_state, DEFAULT_MODEL)
    assert checkpoint_session.run(explorer.sync_weight()).version == 2
    assert torch.equal(checkpoint_session.weight(DOWN), base_state[DOWN].to(ENGINE_DTYPE))
    again = generate(engines)
    assert again["samples"][0]["response_ids"] == before["samples"][0]["response_ids"]
    history = MlflowClient(explorer.tracking_uri).get_metric_history(
        explorer.monitor.run_id, "sync/model_version"
    )
    assert [m.value for m in history] == [1.0, 2.0]


@pytest.mark.parametrize("method", ["checkpoint", "memory"])
def test_a_tied_lm_head_scores_with_the_loaded_embeddings(engines, base_state, tmp_path, method):
    """The tiny models tie the LM head to the input embeddings; vLLM's CPU backend keeps a packed copy of the
    head, which its in-place reload does not rebuild. The engine's logprobs after a load must be those of the
    loaded checkpoint (not of the new embeddings under the old head): Transformers scores the same ids."""
    sync = (f"synchronizer.sync_method={method}", "synchronizer.sync_timeout=120")
    session = Session(engines, tmp_path, *sync)
    try:
        explorer = session.explorer
        doubled = {**base_state, EMBED: base_state[EMBED] * 2.0}  # the head's logits double; RMSNorm hides
        # the input side. A checkpoint sync loads this folder; Transformers scores it for both
        root = explorer.checkpoint_dir if method == "checkpoint" else tmp_path / "scored"
        folder = write_checkpoint(root, 1, doubled, DEFAULT_MODEL)
        if method == "memory":
            payload = {"kind": "memory", "state": [ray.put(doubled)], "meta": meta_of(doubled)}
            ray.get(explorer.hub.publish.remote(1, payload))
        assert session.run(explorer.sync_weight()).version == 1
        after = generate(engines)
        sample = after["samples"][0]
        expected = scored_by_transformers(folder, after["prompt_ids"], sample["response_ids"])
        assert sample["logprobs"] == pytest.approx(expected, abs=1e-3)
    finally:
        session.close()


def test_truncated_checkpoint_is_refused_and_the_old_weights_stay(engines, base_state, checkpoint_session):
    explorer = checkpoint_session.explorer
    step_1 = write_checkpoint(explorer.checkpoint_dir, 1, base_state, DEFAULT_MODEL)
    assert checkpoint_session.run(explorer.sync_weight()).ok
    broken = write_checkpoint(explorer.checkpoint_dir, 2, flat_logits(base_state), DEFAULT_MODEL)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4096])

    outcome = checkpoint_session.run(explorer.sync_weight())
    assert not outcome.ok and outcome.version == 1
    assert "truncated" in outcome.reason and str(weights) in outcome.reason
    assert explorer.state.sync_failures == 1 and explorer.state.model_version == 1
    assert torch.equal(checkpoint_session.weight(NORM), base_state[NORM].to(ENGINE_DTYPE))
    assert generate(engines)["model_version"] == 1
    assert step_1.is_dir()


def test_sync_times_out_and_exploring_goes_on(engines, tmp_path):
    session = Session(engines, tmp_path, "synchronizer.sync_method=checkpoint", "synchronizer.sync_timeout=2")
    try:
        outcome = session.run(session.explorer.sync_weight())
    finally:
        session.close()
    assert not outcome.ok and outcome.version == 0
    assert outcome.wait_s >= 2.0  # it waited out sync_timeout, then gave up
    assert "no version newer than 0 within 2 s" in outcome.reason


def test_a_stopped_trainer_does_not_make_the_explorer_wait(engines, tmp_path):
    session = Session(
        engines, tmp_path, "synchronizer.sync_method=checkpoint", "synchronizer.sync_timeout=600"
    )
    try:
        status = session.explorer.checkpoint_dir / "trainer_status.json"
        status.parent.mkdir(parents=True, exist_ok=True)
        status.write_text(json.dumps({"state": "stopped", "version": 0}))
        outcome = session.run(session.explorer.sync_weight())
        assert not outcome.ok and outcome.wait_s < 60  # far below the 600 s timeout
    finally:
        session.close()


def test_memory_sync_through_the_object_store(engines, base_state, tmp_path):
    session = Session(engines, tmp_path, "synchronizer.sync_method=memory", "synchronizer.sync_timeout=30")
    try:
        state = {**base_state, DOWN: base_state[DOWN] * 0.5}
        payload = {"kind": "memory", "state": [ray.put(state)], "meta": meta_of(state)}
        ray.get(session.explorer.hub.publish.remote(7, payload))
        outcome = session.run(session.explorer.sync_weight())
        assert outcome.ok and outcome.version == 7
        assert torch.equal(session.weight(DOWN), state[DOWN].to(ENGINE_DTYPE))
        assert generate(engines)["model_version"] == 7
    finally:
        session.close()


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import test modules


@ray.remote(num_cpus=0)
class BroadcastTrainer:
    """Rank 0 in its own process: offers the group on the hub, announces a version, sends it in buckets."""

    def run(self, hub_name: str, state: dict[str, torch.Tensor], version: int) -> int:
        from operators.actors.names import NAMESPACE
        from pipelines.reference.trainer import free_port

        hub = ray.get_actor(hub_name, namespace=NAMESPACE)
        workers = ray.get(hub.wait_workers.remote(30))
        port = free_port()
        ray.get(hub.offer_group.remote("127.0.0.1", port))
        group = open_group("127.0.0.1", port, 0, 1 + workers, "gloo", 60)
        bucket = 64 * 1024  # small buckets: several transfers (not one per tensor) even for the tiny model
        ray.get(
            hub.publish.remote(version, {"kind": "broadcast", "meta": meta_of(state), "bucket_bytes": bucket})
        )
        return send(group, state, limit=bucket)


def test_broadcast_over_gloo_from_a_trainer_process_delivers_exact_tensors(engines, base_state, tmp_path):
    session = Session(engines, tmp_path, "synchronizer.sync_method=broadcast", "synchronizer.sync_timeout=60")
    try:
        generator = torch.Generator().manual_seed(3)
        state = {
            name: torch.randn(t.shape, generator=generator).to(ENGINE_DTYPE) for name, t in base_state.items()
        }
        sent = BroadcastTrainer.remote().run.remote(session.explorer.hub_name, state, 3)
        outcome = session.run(session.explorer.sync_weight())
        assert outcome.ok and outcome.version == 3
        assert ray.get(sent) == sum(t.numel() * t.element_size() for t in state.values()) == outcome.nbytes
        for name in (DOWN, NORM, "model.embed_tokens.weight"):
            assert torch.equal(session.weight(name), state[name])
    finally:
        session.close()


def steps_and_versions(run_dir) -> dict[int, set[int]]:
    table = pq.read_table(run_dir / "experiences", columns=["step", "model_version"])
    versions: dict[int, set[int]] = {}
    for step, version in zip(table["step"].to_pylist(), table["model_version"].to_pylist(), strict=True):
        versions.setdefault(step, set()).add(version)
    return versions


@pytest.mark.parametrize("method", ["checkpoint", "memory", "broadcast"])
def test_closed_loop_versions_rise_within_the_staleness_bound(engines, tmp_path, method):
    overrides = [
        "buffer.total_steps=4",
        f"synchronizer.sync_method={method}",
        "synchronizer.sync_offset=1",
        "synchronizer.max_staleness=1",
        "synchronizer.sync_timeout=120",
    ]
    cfg = load_config(None, [*BASE, *overrides])
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines, with_trainer=True)
    versions = steps_and_versions(summary.run_dir)
    assert all(len(v) == 1 for v in versions.values())  # a step runs on one version
    by_step = [versions[step].pop() for step in (1, 2, 3, 4)]
    assert by_step[:2] == [0, 0]  # offset 1: the first sync comes after step 2
    assert 0 < by_step[2] < by_step[3]  # then each period runs on a newer version than the last
    client = MlflowClient(summary.tracking_uri)
    worst = client.get_metric_history(summary.mlflow_run_id, "rollout/staleness/max")
    assert len(worst) == 4 and max(m.value for m in worst) <= 1
    dropped = client.get_metric_history(summary.mlflow_run_id, "rollout/stale_dropped")
    assert sum(m.value for m in dropped) == 0
    assert summary.model_version >= 3
    if method == "checkpoint":
        assert (summary.run_dir / "checkpoints" / "global_step_4").is_dir()
    # the closed loop's before and after: four steps, so the first two against the last two
    reward = {
        m.step: m.value for m in client.get_metric_history(summary.mlflow_run_id, "rollout/reward/mean")
    }
    change = {c.name: c for c in summary.learning.training}["reward"]
    assert change.before == pytest.approx((reward[1] + reward[2]) / 2)
    assert change.after == pytest.approx((reward[3] + reward[4]) / 2)
    assert "training, mean of steps 1-2 -> steps 3-4" in summary.render()
    assert (summary.run_dir / "learning.png").read_bytes().startswith(b"\x89PNG")
    assert "learning.png" in [a.path for a in client.list_artifacts(summary.mlflow_run_id)]


def test_stale_experiences_are_dropped_counted_and_logged(engines, base_state, tmp_path):
    """A trainer far ahead (version 5 on disk) and no sync before step 2: both steps are too stale."""
    overrides = [
        "buffer.total_steps=2",
        "synchronizer.sync_method=checkpoint",
        "synchronizer.sync_offset=1",
        "synchronizer.max_staleness=2",
        "synchronizer.sync_timeout=60",  # bounds the load of version 5 too: room on a loaded machine
    ]
    run_dir = tmp_path / "run"
    write_checkpoint(run_dir / "checkpoints", 5, base_state, DEFAULT_MODEL)
    summary = explore(load_config(None, [*BASE, *overrides]), run_dir, progress=False, engines=engines)
    client = MlflowClient(summary.tracking_uri)
    history = client.get_metric_history(summary.mlflow_run_id, "rollout/stale_dropped")
    assert {m.step: m.value for m in history} == {1: 8.0, 2: 8.0}  # both ran on version 0, 5 behind
    assert pq.read_table(run_dir / "experiences").num_rows == 0
    assert summary.model_version == 5  # the sync after step 2 took the trainer's version
