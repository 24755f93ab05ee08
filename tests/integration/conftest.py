"""One engine actor shared by the integration modules that reuse engines (engine start takes 15-40 s here).

Each `Explorer` puts the engines back on its own run's model version when it prepares, so tests that sync
weights leave nothing behind for the next.
"""

from __future__ import annotations

import pytest
from integration_settings import BASE

from pipelines.runtime import init_ray, start_engines, stop_engines
from schemas.config import load_config


@pytest.fixture(scope="session")
def engines():
    cfg = load_config(None, BASE)
    init_ray(cfg.ray)
    engines = start_engines(cfg, "integration-tests")
    yield engines
    stop_engines(engines)
