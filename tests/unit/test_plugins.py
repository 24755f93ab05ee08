"""Plugin loading: registration, idempotence, errors that name the file, and symlinks escaping the dir."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from operators.rollout import plugins, reward_registry
from operators.rollout.plugins import PluginError, load_plugins
from operators.rollout.reward_registry import get_reward_fn
from operators.workflows import base
from operators.workflows.base import create_workflow

PLUGIN = """
from operators.workflows import SingleTurnWorkflow, register_reward, register_workflow


@register_reward("always_one")
def always_one(response, truth):
    return {"reward": 1.0}


@register_workflow("echo")
class EchoWorkflow(SingleTurnWorkflow):
    default_reward_fn = "always_one"
"""


pytestmark = pytest.mark.usefixtures("scratch_registries")  # tests/unit/conftest.py


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


def test_a_plugin_registers_a_workflow_and_a_reward(tmp_path):
    write(tmp_path, "echo.py", PLUGIN)
    write(tmp_path, "_helper.py", "raise RuntimeError('private files are not plugins')")
    write(tmp_path, "notes.txt", "not python")
    names = load_plugins(tmp_path)
    assert len(names) == 1 and names[0].startswith("rftflow_plugin_") and names[0].endswith("_echo")
    assert get_reward_fn("always_one")("x", "y") == {"reward": 1.0}
    workflow = create_workflow("echo")
    assert type(workflow).__name__ == "EchoWorkflow" and workflow.asynchronous


def test_loading_twice_registers_nothing_twice(tmp_path):
    write(tmp_path, "echo.py", PLUGIN)
    first = load_plugins(tmp_path)
    cls = base.WORKFLOWS["echo"]
    assert load_plugins(tmp_path) == first
    assert base.WORKFLOWS["echo"] is cls


def test_a_reimported_plugin_module_replaces_its_definitions(tmp_path):
    write(tmp_path, "echo.py", PLUGIN)
    (name,) = load_plugins(tmp_path)
    del sys.modules[name]  # e.g. a fresh import of the same file
    load_plugins(tmp_path)
    assert base.WORKFLOWS["echo"] is sys.modules[name].EchoWorkflow


def test_plugins_load_in_name_order(tmp_path):
    for name in ("b", "a"):
        text = (
            f"import operators.rollout.reward_registry as r\nr.ORDER = [*getattr(r, 'ORDER', []), '{name}']\n"
        )
        write(tmp_path, f"{name}.py", text)
    try:
        load_plugins(tmp_path)
        assert reward_registry.ORDER == ["a", "b"]
    finally:
        del reward_registry.ORDER


def test_a_broken_plugin_is_named(tmp_path):
    path = write(tmp_path, "broken.py", "import no_such_module_here\n")
    with pytest.raises(PluginError, match="broken.py failed to import: ModuleNotFoundError") as info:
        load_plugins(tmp_path)
    assert str(path) in str(info.value)
    assert not any(name.endswith("_broken") for name in sys.modules)  # a fixed file can be loaded later


def test_a_plugin_calling_exit_is_an_error_not_an_exit(tmp_path):
    write(tmp_path, "quits.py", "raise SystemExit(3)\n")
    with pytest.raises(PluginError, match="quits.py failed to import: SystemExit"):
        load_plugins(tmp_path)


def test_a_plugin_reusing_a_builtin_name_is_named(tmp_path):
    write(tmp_path, "clash.py", PLUGIN.replace('"echo"', '"math"'))
    with pytest.raises(PluginError, match=r"clash.py failed.*'math' is already registered"):
        load_plugins(tmp_path)


def test_a_missing_directory_is_an_error(tmp_path):
    with pytest.raises(PluginError, match="does not exist"):
        load_plugins(tmp_path / "nope")


def test_a_symlink_escaping_the_directory_is_refused(tmp_path):
    outside = write(tmp_path / "elsewhere", "evil.py", "raise SystemExit('must never run')")
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "evil.py").symlink_to(outside)
    with pytest.raises(PluginError, match="evil.py resolves to .*outside"):
        load_plugins(plugin_dir)


def test_a_symlink_inside_the_directory_is_fine(tmp_path):
    real = write(tmp_path, "echo.py", PLUGIN)
    (tmp_path / "alias.py").symlink_to(real)
    assert len(load_plugins(tmp_path)) == 1  # both names resolve to one file, imported once


def test_module_names_differ_per_directory(tmp_path):
    a, b = write(tmp_path / "a", "p.py", ""), write(tmp_path / "b", "p.py", "")
    assert plugins.module_name(a) != plugins.module_name(b)
