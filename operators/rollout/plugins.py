"""User plugins: `*.py` files whose decorators (`@register_workflow`, `@register_reward`, `@register_op`)
extend registries.

The driver and every Ray worker load the same plugin directory, so loading must be idempotent: a file is
imported once per process under a module name derived from its resolved path, and registering a definition
again (same module and qualified name, e.g. after a re-import) replaces it instead of failing
(`operators.rollout.registration`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path

from operators.ops.registry import load_builtins as load_builtin_ops
from operators.workflows.base import load_builtins


class PluginError(ImportError):
    """A plugin directory or file that cannot be loaded; the message names the file."""


def module_name(path: Path) -> str:
    """A module name unique to the file's resolved path, so two plugin dirs never collide."""
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", resolved.stem)
    return f"rftflow_plugin_{digest}_{stem}"


def plugin_files(plugin_dir: Path) -> list[Path]:
    """The `*.py` files directly inside `plugin_dir`, sorted, skipping `_`-prefixed names and escapes."""
    if not plugin_dir.is_dir():
        raise PluginError(f"plugin directory {plugin_dir} does not exist or is not a directory")
    root = plugin_dir.resolve()
    files = []
    for path in sorted(plugin_dir.glob("*.py")):
        if path.name.startswith("_"):
            continue
        if not path.resolve().is_relative_to(root):
            raise PluginError(f"plugin {path} resolves to {path.resolve()}, outside {root}; refusing it")
        if path.is_file():
            files.append(path)
    return files


def load_plugins(plugin_dir: Path) -> list[str]:
    """Import each plugin file in `plugin_dir` (once per process); returns their module names, by file name.

    The built-in workflows and experience ops are loaded first, so a plugin that reuses a built-in name fails
    here, naming the plugin, rather than later when the built-ins load lazily.
    """
    load_builtins()
    load_builtin_ops()
    names = []
    for path in plugin_files(Path(plugin_dir)):
        name = module_name(path)
        if name in names:  # a symlink to a file already listed
            continue
        names.append(name)
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise PluginError(f"plugin {path} cannot be imported")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before executing, as a normal import does (dataclasses, pickling)
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:  # a plugin's exit() must not end the worker
            del sys.modules[name]
            raise PluginError(f"plugin {path} failed to import: {type(exc).__name__}: {exc}") from exc
    return names
