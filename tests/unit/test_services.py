"""A missing server skips its test on a developer's machine and fails it under CI (tests/services.py)."""

from __future__ import annotations

import pytest
from services import PG_URL, missing_service, postgres_url


def test_a_missing_server_fails_its_test_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is missing .*CI=true"):
        missing_service("chromium is missing")
    monkeypatch.delenv(PG_URL, raising=False)
    with pytest.raises(pytest.fail.Exception, match=f"{PG_URL} is not set"):
        postgres_url()


def test_a_missing_server_skips_its_test_elsewhere(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(PG_URL, raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{PG_URL} is not set"):
        postgres_url()
    monkeypatch.setenv(PG_URL, "postgresql+psycopg://u@127.0.0.1/db")
    assert postgres_url() == "postgresql+psycopg://u@127.0.0.1/db"
