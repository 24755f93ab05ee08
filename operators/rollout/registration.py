"""Name registries that plugins extend (workflows, reward functions): each name is registered once.

The driver and every Ray worker load the same plugin files, and a plugin may be imported again, so
registering the same definition again (same module and qualified name) replaces it instead of failing.
It lives below both registries and the plugin loader, so that they all depend on it and not on each other.
"""

from __future__ import annotations

import importlib
from typing import Any


def same_definition(a: Any, b: Any) -> bool:
    """True when `b` is `a`, or the same source definition re-imported (same module and qualified name)."""
    if a is b:
        return True
    key = ("__module__", "__qualname__")
    return all(getattr(a, k, None) is not None and getattr(a, k, None) == getattr(b, k, None) for k in key)


def register_once(registry: dict[str, Any], kind: str, name: str, obj: Any) -> None:
    """Add `obj` under `name`; a different definition under a taken name is an error, the same one is not."""
    if name in registry and not same_definition(registry[name], obj):
        taken = registry[name]
        where = f"{getattr(taken, '__module__', '?')}.{getattr(taken, '__qualname__', '?')}"
        raise ValueError(f"{kind} '{name}' is already registered (by {where})")
    registry[name] = obj


def import_all(modules: tuple[str, ...]) -> None:
    """Import modules whose import registers built-ins (lazily: they may pull in heavy dependencies)."""
    for module in modules:
        importlib.import_module(module)


def lookup(registry: dict[str, Any], kind: str, name: str) -> Any:
    """The entry under `name`, or a KeyError listing the known names."""
    try:
        return registry[name]
    except KeyError:
        raise KeyError(f"unknown {kind} '{name}' (known: {', '.join(sorted(registry))})") from None
