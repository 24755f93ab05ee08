"""docs/trinity-keys.md, generated from the Trinity-RFT key table by docs/trinity_keys.py, is current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from docs_pages import check_page, copy_page, load_generator

from schemas.trinity_keys import TRINITY
from schemas.trinity_rules import Ignore

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "trinity_keys.py"


@pytest.fixture(scope="module")
def page() -> ModuleType:
    return load_generator(SCRIPT)


@pytest.fixture
def page_copy(tmp_path: Path) -> Path:
    return copy_page("trinity-keys.md", tmp_path)


def test_the_page_is_current():
    result = check_page(SCRIPT)
    assert result.returncode == 0, result.stderr


def test_every_key_has_one_row_saying_what_is_done_with_it(page: ModuleType):
    rows = page.rows(TRINITY)
    keys = [key for key, _, _ in rows]
    assert len(keys) == len(set(keys))
    handling = dict((key, how) for key, how, _ in rows)
    assert handling["buffer.explorer_input.tasksets.N.data_selector.selector_type"] == (
        "mapped: `buffer.explorer_input.tasksets.N.data_selector.selector_type`"
    )
    assert handling["explorer.rollout_model.tensor_parallel_size"].startswith(
        "mapped: `explorer.rollout_model."
    )
    assert handling["buffer.explorer_input.eval_tasksets.N.repeat_times"] == (
        "mapped: `buffer.explorer_input.eval_tasksets.N.repeat_times`"
    )
    assert handling["trainer"] == "ignored"
    assert all(
        how.split(":")[0].split(" ")[0] in ("mapped", "ignored", "refused") for how in handling.values()
    )


def test_a_changed_reason_fails_the_check_naming_the_key(page: ModuleType, page_copy: Path, monkeypatch):
    assert page.check(page_copy) is None
    monkeypatch.setitem(TRINITY.keys, "group", Ignore("a changed reason"))
    problem = page.check(page_copy)
    assert problem is not None and "`group`" in problem and "a changed reason" in problem
    assert page.main(["--check", "--page", str(page_copy)]) == 1
    assert page.write(page_copy) is True and page.check(page_copy) is None


def test_an_edited_page_fails_the_cli_check(page_copy: Path):
    text = page_copy.read_text()
    page_copy.write_text(text.replace("| `project` | mapped: `project` |", "| `project` | ignored |", 1))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--page", str(page_copy)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "`project`" in result.stderr
