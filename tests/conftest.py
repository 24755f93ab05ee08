"""Shared test settings (no usage stats, no hub, quiet vLLM) and the engine actor the stack tests share."""

import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def engines():
    """One engine actor for the stack tests that reuse engines (an engine start takes 15-40 s).

    Each `Explorer` puts the engines back on its own run's model version when it prepares, so tests that sync
    weights leave nothing behind for the next.
    """
    from integration_settings import BASE

    from pipelines.runtime import init_ray, start_engines, stop_engines
    from schemas.config import load_config

    cfg = load_config(None, BASE)
    init_ray(cfg.ray)
    engines = start_engines(cfg, "integration-tests")
    yield engines
    stop_engines(engines)
