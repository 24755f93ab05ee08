"""Serve mode's rolling update on two real engine actors, during real HTTP traffic: a new checkpoint goes in
engine by engine and no request fails; each answer's version header is the version its engine held at
dispatch; a load that fails on the second engine puts the first back, and both serve the old version.

The checkpoints are copies of the tiny model's own weights, written as `global_step_N/` the way a trainer
writes them; the failed load is a real one (the second engine's weights file is removed as it starts).
"""

from __future__ import annotations

import asyncio
import shutil
import time

import httpx
import pytest
import ray
from integration_settings import BASE

from pipelines.control.fleet import EngineFleet, LoadError
from pipelines.control.rolling import roll
from pipelines.control.weight_updates import WeightUpdate
from pipelines.serving.service import Service
from schemas.config import DEFAULT_MODEL, load_config

TWO = [*BASE, "explorer.rollout_model.engine_num=2"]


@pytest.fixture(scope="module")
def two_engines(engines):  # `engines`: Ray is up, with the session's engine beside these two
    fleet = EngineFleet(load_config(None, TWO), "serve-rolling").start()
    yield fleet
    fleet.stop()


def versions(fleet) -> list[int]:
    return ray.get([h.get_model_version.remote() for h in fleet.handles], timeout=30)


def test_a_rolling_update_during_traffic_fails_no_request_and_a_failed_load_rolls_back(
    loop, two_engines, tmp_path
):
    settings = ["mode=serve", "serve.port=0", "synchronizer.sync_method=checkpoint"]
    cfg = load_config(None, [*TWO, *settings, "serve.health_check_interval_s=0.3"])
    service = Service(cfg, tmp_path, fleet=two_engines)
    url = loop.run_until_complete(service.start()).url
    answers: list[tuple[int, str | None, float]] = []

    async def traffic(stop: asyncio.Event) -> None:
        body = {
            "model": "tiny-arith-llama",
            "messages": [{"role": "user", "content": "1+1="}],
            "max_tokens": 8,
        }
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while not stop.is_set():
                answer = await http.post("/v1/chat/completions", json=body)
                answers.append(
                    (answer.status_code, answer.headers.get("x-rftflow-model-version"), time.time())
                )

    async def scenario() -> float:
        stop = asyncio.Event()
        users = [asyncio.ensure_future(traffic(stop)) for _ in range(4)]
        await asyncio.sleep(1.0)
        shutil.copytree(DEFAULT_MODEL, tmp_path / "checkpoints" / "global_step_1")
        for _ in range(600):
            if two_engines.version == 1:
                break
            await asyncio.sleep(0.1)
        rolled = time.time()
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*users)
        return rolled

    try:
        rolled = loop.run_until_complete(asyncio.wait_for(scenario(), 120))
        assert two_engines.version == 1 and versions(two_engines) == [1, 1]
        assert len(answers) > 20 and all(status == 200 for status, _, _ in answers)
        assert {v for _, v, _ in answers} == {"0", "1"}
        assert all(v == "1" for _, v, at in answers if at > rolled + 0.5)  # every engine serves 1 after

        # a second version whose load fails on engine 1: engine 0 is put back, both serve version 1
        bad = shutil.copytree(DEFAULT_MODEL, tmp_path / "bad" / "global_step_2")

        def on_loading(index: int, loading: bool) -> None:
            if index == 1 and loading and (bad / "model.safetensors").exists():
                (bad / "model.safetensors").unlink()

        with pytest.raises(LoadError, match="engines \\[0\\] put back"):
            roll(two_engines, WeightUpdate(2, "checkpoint", path=bad), 60, on_loading)
        assert two_engines.version == 1 and versions(two_engines) == [1, 1]
    finally:
        loop.run_until_complete(service.stop())
        two_engines.load(WeightUpdate(0, "checkpoint", path=DEFAULT_MODEL), 60)
