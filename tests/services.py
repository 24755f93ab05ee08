"""What a test does when a server it needs (PostgreSQL, Chromium) is missing: skip it on a developer's
machine, but fail it under CI (`CI=true`). There `.ci/run` installs and starts every server before pytest
starts, so a missing one is a broken set-up and must not pass as a skip."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

# set by .ci/run, which starts a throwaway PostgreSQL server (.ci/postgres)
PG_URL = "RFTFLOW_TEST_POSTGRES_URL"


def under_ci() -> bool:
    """True under CI, which sets CI=true (as GitHub Actions and most CI systems do)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing_service(reason: str) -> NoReturn:
    """Skip the calling test for `reason`, or fail it under CI."""
    if under_ci():
        pytest.fail(f"{reason} (CI=true: every server the suite needs must be there)", pytrace=False)
    pytest.skip(reason)


def postgres_url() -> str:
    """The test PostgreSQL server's SQLAlchemy URL, or a skip (a failure under CI) when none was started."""
    return os.environ.get(PG_URL) or missing_service(
        f"{PG_URL} is not set (.ci/run starts a PostgreSQL server)"
    )
