"""The configuration table page, docs/config-table.md, generated from schemas/config.py by
docs/config_table.py, is current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from docs_pages import check_page, copy_page, load_generator

from schemas.config import BufferConfig

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "config_table.py"


def load_script() -> ModuleType:
    return load_generator(SCRIPT)


@pytest.fixture(scope="module")
def table() -> ModuleType:
    return load_script()


@pytest.fixture
def page_copy(tmp_path: Path) -> Path:
    return copy_page("config-table.md", tmp_path)


def test_table_page_is_current():
    result = check_page(SCRIPT)
    assert result.returncode == 0, result.stderr


def test_every_leaf_key_is_documented_once(table: ModuleType):
    keys = [key for key, _, _ in table.leaf_rows(table.Config())]
    assert len(keys) == len(set(keys))
    assert "buffer.explorer_input.taskset.format.prompt_key" in keys
    assert "buffer.explorer_input.taskset" not in keys  # sections expand to their leaves


def test_defaults_render_as_yaml_and_bundled_paths_by_their_doc_text(table: ModuleType):
    rows = {key: default for key, default, _ in table.leaf_rows(table.Config())}
    assert rows["buffer.batch_size"] == "`8`"
    assert rows["buffer.total_steps"] == "`null`"
    assert rows["explorer.rollout_model.enforce_eager"] == "`true`"
    assert rows["buffer.trainer_input.experience_buffer.storage_type"] == "`parquet`"
    assert rows["model.model_path"] == "bundled `tiny-arith-llama`"
    assert rows["buffer.explorer_input.taskset.path"] == "bundled `arith/train.jsonl`"


def test_changed_description_fails_the_check_naming_the_key(
    table: ModuleType, page_copy: Path, monkeypatch: pytest.MonkeyPatch
):
    assert table.check(page_copy) is None
    monkeypatch.setattr(BufferConfig.model_fields["batch_size"], "description", "tasks in one step")
    problem = table.check(page_copy)
    assert problem is not None and "`buffer.batch_size`" in problem
    assert table.main(["--check", "--page", str(page_copy)]) == 1
    assert table.write(page_copy) is True
    assert table.check(page_copy) is None
    assert "| `buffer.batch_size` | `8` | tasks in one step |" in page_copy.read_text()


def test_edited_page_row_fails_the_cli_check(page_copy: Path):
    text = page_copy.read_text()
    page_copy.write_text(text.replace("| tasks per step |", "| tasks per batch |", 1))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--page", str(page_copy)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "`buffer.batch_size`" in result.stderr


def test_missing_markers_are_an_error(table: ModuleType, tmp_path: Path):
    page = tmp_path / "config-table.md"
    page.write_text("# no table here\n")
    assert table.main(["--check", "--page", str(page)]) == 1
