"""The `slow` tier's rules, applied by `tests/conftest.py`: a test marked slow says why (`reason=`), and a
test that takes over `SLOW_S` without the mark is named at the end of the run, so `make test-fast` stays
fast."""

from __future__ import annotations

from collections import defaultdict

import pytest

SLOW_S = 120.0  # a test over this (setup, call and teardown together) belongs in the slow tier


def check_slow_marks(items: list[pytest.Item]) -> None:
    """Refuse a `slow` mark without its one-line reason."""
    bare = [
        item.nodeid
        for item in items
        if (mark := item.get_closest_marker("slow")) and not mark.kwargs.get("reason")
    ]
    if bare:
        raise pytest.UsageError(
            f"@pytest.mark.slow needs reason='...' (why it takes over {SLOW_S:.0f} s): {bare}"
        )


class SlowTierWatch:
    """Adds up each test's phases and names the unmarked ones over `SLOW_S` in the terminal summary."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.marked: set[str] = set()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        if "slow" in report.keywords:
            self.marked.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        over = sorted(n for n, s in self.seconds.items() if s > SLOW_S and n not in self.marked)
        if over:
            terminalreporter.section(f"tests over {SLOW_S:.0f} s without @pytest.mark.slow")
            for nodeid in over:
                terminalreporter.line(f"{self.seconds[nodeid]:.0f} s {nodeid}")
