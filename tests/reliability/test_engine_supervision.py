"""Self-healing mechanics on real Ray, with engine doubles in place of vLLM engines.

`EngineDouble` is a test double: an actor with the engine's interface whose vLLM core can be declared dead on
demand, a fault real engines cannot show when asked. The real thing, a vLLM engine killed mid-step, is in
test_engine_restart.py; these tests show the decisions around it quickly: what a client does with a call in
flight on a lost engine, when the supervisor replaces an engine, on which version, and when it gives up.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import ray

from operators.engine.actor import EngineGone
from operators.engine.call_batches import ServesCallBatches
from operators.engine.client import EngineClient
from pipelines.control.fleet import EngineFleet, EngineLost, Restore
from pipelines.control.runtime import init_ray
from pipelines.control.weight_updates import AdapterSpec, WeightUpdate
from schemas.config import RayConfig, load_config


class EngineDouble(ServesCallBatches):
    """Test double of an engine actor: generates after a delay; after `kill_core` it fails as a dead core."""

    def __init__(self, version: int = 0, closed: bool = False):
        self.version, self.core_dead, self.loads = version, False, []
        self.open = asyncio.Event()
        if not closed:
            self.open.set()

    def ready(self) -> dict:
        return {"pid": os.getpid(), "model_version": self.version}

    def health(self) -> dict:
        if self.core_dead:
            raise EngineGone("vLLM engine core died")
        return {"model_version": self.version}

    def kill_core(self) -> None:
        self.core_dead = True

    async def generate(self, prompt, sampling) -> dict:
        await self.open.wait()
        if self.core_dead:
            raise EngineGone("vLLM engine core died")
        await asyncio.sleep(sampling.get("delay", 0.0))
        return {"prompt_ids": [1], "prompt_text": str(prompt), "model_version": self.version, "samples": []}

    async def load_checkpoint(
        self, path: str, version: int, timeout: float | None = None, preempt: bool = False
    ) -> dict:
        self.version = version
        self.loads.append(path)
        self.open.set()
        return {"version": version, "bytes": 0, "pause_s": 0.0, "load_s": 0.0}

    async def load_adapter(self, path: str, version: int, name: str, probe: dict, keep: int, *rest) -> dict:
        """A LoRA run's load: recorded as the adapter's name, version and folder (or staged state)."""
        self.version = version
        self.loads.append(f"{name}-v{version}:{path}:{probe['logprobs']}")
        self.open.set()
        return {"version": version, "bytes": 0, "pause_s": 0.0, "adapter_d": 0.0, "base_d": 1.0}

    async def load_adapter_state(self, state: list, config: dict, version: int, *rest) -> dict:
        return await self.load_adapter(f"staged {state[0]}", version, *rest)

    def loaded(self) -> list[str]:
        return self.loads


# Ray workers cannot import this test module, so the double travels by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
Double = ray.remote(EngineDouble)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    init_ray(RayConfig(num_cpus=4))


FLEETS: list[EngineFleet] = []


@pytest.fixture(autouse=True)
def no_doubles_left():
    """Each test's engine doubles are stopped after it, whatever it asserted."""
    yield
    while FLEETS:
        FLEETS.pop().stop()


def supervisor(name: str, restore: Restore | None, *more: str, **settings) -> EngineFleet:
    """A fleet of one engine double called `name`, on `restore` (None: the base model); `more`: overrides."""
    overrides = [f"explorer.{k}={v}" for k, v in settings.items()]
    cfg = load_config(None, ["explorer.health_check_timeout=10", *overrides, *more])

    def launch(engine_name: str, closed: bool):
        return Double.options(name=engine_name).remote(closed=closed)

    fleet = EngineFleet(cfg, "unused", launch=launch)
    fleet.names = [name]
    fleet.launch()
    FLEETS.append(fleet)
    if restore is not None:
        fleet.current = restore  # as if a load had put the engines there
    return fleet


def test_a_call_in_flight_on_a_killed_engine_is_sent_again_to_its_replacement():
    name = "double/engine-redispatch"
    first = Double.options(name=name).remote(version=1)
    client = EngineClient.named(name, restart_timeout=60)

    async def scenario() -> int:
        call = asyncio.ensure_future(client.generate("p", {"delay": 5.0}))
        await asyncio.sleep(0.5)  # the request is in flight on `first`
        ray.kill(first, no_restart=True)
        await asyncio.sleep(1.5)  # the client keeps retrying meanwhile
        replacement = Double.options(name=name).remote(version=7)  # the supervisor's part, done by hand
        version = (await call).model_version
        ray.kill(replacement)
        return version

    assert asyncio.run(scenario()) == 7


@pytest.mark.parametrize(
    ("restart_timeout", "absent_s", "message"),
    [
        (2, 15.0, "did not come back within 2s"),  # the replacement is overdue
        (600, 1.0, "the engines were stopped"),  # no actor has the name at all: shutdown, not a restart
    ],
)
def test_a_client_gives_up_when_no_replacement_comes(monkeypatch, restart_timeout, absent_s, message):
    import operators.engine.client as engine_client

    monkeypatch.setattr(engine_client, "ABSENT_S", absent_s)
    name = f"double/engine-abandoned-{restart_timeout}"
    lost = Double.options(name=name).remote()
    client = EngineClient.named(name, restart_timeout=restart_timeout)
    ray.get(lost.ready.remote())
    ray.kill(lost, no_restart=True)
    with pytest.raises(EngineGone, match=message):
        asyncio.run(client.generate("p", {}))


def test_a_dead_core_is_replaced_and_the_replacement_loads_the_current_version():
    watcher = supervisor("double/engine-core", Restore(3, path=Path("/ckpt/global_step_3")))
    assert watcher.check() == []  # healthy: nothing to do
    ray.get(watcher.handles[0].kill_core.remote())
    assert watcher.check() == [0]
    replacement = watcher.handles[0]
    assert ray.get(replacement.ready.remote())["model_version"] == 3
    assert ray.get(replacement.loaded.remote()) == ["/ckpt/global_step_3"]
    assert watcher.restarts == 1 and watcher.check() == []


def test_restarts_are_bounded():
    watcher = supervisor("double/engine-bounded", None, max_engine_restarts=1)
    ray.get(watcher.handles[0].kill_core.remote())
    assert watcher.check() == [0]
    ray.get(watcher.handles[0].kill_core.remote())
    with pytest.raises(EngineLost, match="after 1 restarts; giving up"):
        watcher.check()


def test_a_version_with_nothing_to_reload_from_stops_rather_than_serving_the_base():
    watcher = supervisor("double/engine-unrestorable", Restore(4))  # version 4 came by broadcast
    original = watcher.handles[0]
    ray.get(original.kill_core.remote())
    with pytest.raises(EngineLost, match="broadcast"):
        watcher.check()
    assert watcher.handles[0] is original  # not swapped for an engine on the wrong weights


@pytest.mark.parametrize("kind", ["checkpoint", "memory"])
def test_a_killed_engine_of_a_lora_run_comes_back_on_the_current_adapter_version(kind):
    """The fleet's own load makes the restore point; the replacement of a killed engine loads that adapter
    (the same folder, or the same object ref staged afresh) and its probe, not the base model."""
    lora = ["model.lora.name=policy", "explorer.rollout_model.dtype=float32"]
    watcher = supervisor(f"double/engine-lora-{kind}", None, *lora)
    probe = {"token_ids": [1, 2, 3], "logprobs": [-0.5, -1.5]}
    spec = AdapterSpec("policy", probe, keep=1)
    ref = ray.put({"lora_A": [0.0]}) if kind == "memory" else None
    path = Path("/ckpt/global_step_4") if kind == "checkpoint" else None
    watcher.load(WeightUpdate(4, kind, path=path, state=ref, adapter=spec), 30)
    first = ray.get(watcher.handles[0].loaded.remote())
    ray.kill(watcher.handles[0], no_restart=True)  # the engine actor is killed mid-run
    assert watcher.check() == [0]
    replacement = watcher.handles[0]
    assert ray.get(replacement.ready.remote())["model_version"] == 4
    assert ray.get(replacement.loaded.remote()) == first and first[0].startswith("policy-v4:")
    assert watcher.restore_point.adapter == spec and watcher.restarts == 1
