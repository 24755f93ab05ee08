"""Names that moved keep working from their old homes, with a DeprecationWarning naming the new import.

A plugin written against an earlier layout (`from operators.rewards import register_reward`) must still
load. Each old home defines a module `__getattr__` built here, so the warning fires only when a moved name
is actually imported from it, and says where to import it now.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved_names(old_home: str, new_homes: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `old_home`: each name in `new_homes` is found in the module named there."""

    def getattr_(name: str) -> Any:
        if name not in new_homes:
            raise AttributeError(f"module {old_home!r} has no attribute {name!r}")
        new_home = new_homes[name]
        warnings.warn(
            f"`from {old_home} import {name}` is deprecated: use `from {new_home} import {name}`",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_home), name)

    return getattr_
