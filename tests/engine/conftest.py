"""One in-process vLLM CPU engine (no Ray) for the whole session: engine start takes 15-25 s."""

from __future__ import annotations

import asyncio

import pytest

from operators.engine import VLLMEngine
from schemas.config import DEFAULT_MODEL, RolloutModelConfig


@pytest.fixture(scope="session")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def engine(loop):
    # AsyncLLM binds its output handler to the loop it first runs on, so build and use it on one loop.
    async def start() -> VLLMEngine:
        return VLLMEngine(str(DEFAULT_MODEL), RolloutModelConfig(device="cpu").model_dump(mode="json"))

    engine = loop.run_until_complete(start())
    yield engine
    engine.shutdown()
