"""Shared test settings (no usage stats, no hub, quiet vLLM) and the engines tests share: one in-process
engine and one engine actor per session at most (an engine start takes 15-40 s)."""

import asyncio
import os
from pathlib import Path

import pytest
from slow_tier import SlowTierWatch, check_slow_marks

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

UNIT_TIER = Path(__file__).parent / "unit"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SlowTierWatch(), "rftflow-slow-tier")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The unit tier runs first (a stable sort): it fails fast, and it runs before any session fixture has
    started Ray or an engine, so its check that no unit test starts either holds exactly."""
    check_slow_marks(items)
    items.sort(key=lambda item: item.path.is_relative_to(UNIT_TIER) is False)


@pytest.fixture(scope="session")
def engines():
    """One started `EngineFleet` of one engine for the stack tests that share engines (a start takes 15-40 s).

    Each `Explorer` puts the engines back on its own run's model version when it prepares, so tests that sync
    weights leave nothing behind for the next.
    """
    from integration_settings import BASE

    from pipelines.control.fleet import EngineFleet
    from pipelines.control.runtime import init_ray
    from schemas.config import load_config

    cfg = load_config(None, BASE)
    init_ray(cfg.ray)
    fleet = EngineFleet(cfg, "integration-tests").start()
    yield fleet
    fleet.stop()


@pytest.fixture(scope="session")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def start_engine(loop, model_path, **rollout_fields):
    """An in-process vLLM CPU engine on `model_path`, started on `loop`: AsyncLLM binds its output handler to
    the loop it first runs on, so it is built and used on one loop. float32 unless the test asks otherwise
    (as `integration_settings.BASE` says why)."""
    from operators.engine.actor import VLLMEngine
    from schemas.engine_config import RolloutModelConfig

    async def start() -> VLLMEngine:
        rollout = RolloutModelConfig(
            device="cpu", enable_openai_api=True, **{"dtype": "float32", **rollout_fields}
        )
        engine = VLLMEngine(str(model_path), rollout.model_dump(mode="json"))
        await engine.ready()
        return engine

    return loop.run_until_complete(start())


@pytest.fixture(scope="session")
def engine(loop):
    """One in-process vLLM CPU engine (no Ray), for tests of the workflow and the engine themselves. It
    serves its OpenAI API on every interface, so with an API key (the case the key exists for)."""
    from integration_settings import ENGINE_API_KEY

    from schemas.config import DEFAULT_MODEL

    engine = start_engine(loop, DEFAULT_MODEL, host="0.0.0.0", api_key=ENGINE_API_KEY)
    yield engine
    loop.run_until_complete(engine.shutdown())


@pytest.fixture(scope="session")
def tool_engine(loop):
    """An in-process engine on the tiny tool model (`pipelines/assets/tiny-tool-llama`), for `tool_math` and
    `openai_calc_agent`; it serves its OpenAI API on 127.0.0.1."""
    from schemas.config import TOOL_MODEL

    engine = start_engine(loop, TOOL_MODEL)
    yield engine
    loop.run_until_complete(engine.shutdown())


@pytest.fixture(scope="module")
def fc_engine(loop):
    """An in-process engine on the function-calling model (`pipelines/assets/tiny-fc-llama`) whose OpenAI API
    runs vLLM's hermes tool parser, for `tool_math_fc`; module-scoped, so it is stopped before the next
    module's engine starts."""
    from schemas.config import FC_MODEL

    engine = start_engine(loop, FC_MODEL, tool_call_parser="hermes")
    yield engine
    loop.run_until_complete(engine.shutdown())


@pytest.fixture
def loopback_only():
    """No connection off this machine while the test runs (tests/loopback_guard.py); yields the guard, whose
    `refused` lists what was tried anyway."""
    from loopback_guard import GUARD

    with GUARD.watching() as guard:
        yield guard


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto) on 127.0.0.1, for the object-store tests; killed at the end."""
    from object_store import start_s3_server

    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()
