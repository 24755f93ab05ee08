"""Fixtures for the reliability tests: tests/engine's in-process engine, re-exported rather than copied."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def engine_fixtures():
    """tests/engine/conftest.py under a name of its own (pytest imports every conftest as `conftest`)."""
    path = Path(__file__).resolve().parents[1] / "engine" / "conftest.py"
    spec = importlib.util.spec_from_file_location("rftflow_engine_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_engine_fixtures = engine_fixtures()
loop, engine = _engine_fixtures.loop, _engine_fixtures.engine
