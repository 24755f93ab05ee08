"""What the tests of the generated docs pages share: loading a generator from `docs/` as a module, and running
its `--check` as a user would."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_generator(script: Path) -> ModuleType:
    """The generator `script` (a file under docs/, not a package module) as a module."""
    spec = importlib.util.spec_from_file_location(script.stem, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_page(script: Path) -> subprocess.CompletedProcess:
    """`python docs/<script> --check` from the checkout's root."""
    command = [sys.executable, str(script), "--check"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def copy_page(name: str, folder: Path) -> Path:
    """A copy of docs/<name> in `folder`, for a test that edits a page."""
    return Path(shutil.copy(ROOT / "docs" / name, folder / name))
