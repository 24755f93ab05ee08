"""OmegaConf interpolation in config files (`${oc.env:VAR,default}`, `${a.b}`), and the environment's values
kept out of everything rftflow writes.

A config may read paths, URLs and keys from the environment. The run needs the values; what it shows and saves
(config.yaml, MLflow params, `--dry-run`) holds the `${oc.env:NAME}` reference instead, since a value may be a
secret. A saved config.yaml is read back through the same resolution, so a resume or a trainer reading the
run finds the values in its own environment.
"""

from __future__ import annotations

import os
import re
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from schemas.errors import InputError

ENV_NAME = re.compile(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)")
MIN_HIDDEN_CHARS = 3  # a shorter value (a flag, a digit) is not hidden: it would match everywhere


def leaves(tree: Any) -> list[str]:
    """Every string leaf of a tree of dicts and lists."""
    if isinstance(tree, dict):
        return [s for value in tree.values() for s in leaves(value)]
    if isinstance(tree, list):
        return [s for value in tree for s in leaves(value)]
    return [tree] if isinstance(tree, str) else []


ENV_REFERENCE = re.compile(r"\$\{oc\.env:\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:,([^}]*))?\}")


def resolve_env(tree: Any, source: str, key: str = "") -> Any:
    """Only `${oc.env:NAME}` and `${oc.env:NAME,default}` resolved (rftflow's own configs, and the config.yaml
    a run saves): other `${...}` text, say in a prompt, stays as written."""
    if isinstance(tree, dict):
        return {k: resolve_env(v, source, f"{key}.{k}" if key else str(k)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [resolve_env(v, source, f"{key}.{i}") for i, v in enumerate(tree)]
    if not isinstance(tree, str):
        return tree

    def value(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default.strip()
        hint = "set the variable, or give a default: ${oc.env:VAR,default}"
        raise InputError(f"environment variable {name} is not set: {hint}", file=source, field=key or None)

    return ENV_REFERENCE.sub(value, tree)


def env_values(tree: Any) -> dict[str, str]:
    """NAME -> value of each variable the tree's `${oc.env:NAME}` reads and the environment sets."""
    names = {name for text in leaves(tree) for name in ENV_NAME.findall(text)}
    return {
        name: os.environ[name] for name in sorted(names) if len(os.environ.get(name, "")) >= MIN_HIDDEN_CHARS
    }


def resolve(tree: dict[str, Any], source: str) -> dict[str, Any]:
    """The tree with interpolation resolved by OmegaConf; an unset variable without a default is named."""
    try:
        return OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or None
        hint = "set the variable, or give a default: ${oc.env:VAR,default}"
        raise InputError(
            f"interpolation failed ({str(exc).splitlines()[0]}): {hint}", file=source, field=key
        ) from None


def hide_env(tree: Any, env: dict[str, str]) -> Any:
    """`tree` with each environment value inside a string leaf put back as `${oc.env:NAME}`, longest first."""
    if not env:
        return tree
    if isinstance(tree, dict):
        return {key: hide_env(value, env) for key, value in tree.items()}
    if isinstance(tree, list):
        return [hide_env(value, env) for value in tree]
    if isinstance(tree, str):
        for name, value in sorted(env.items(), key=lambda item: -len(item[1])):
            tree = tree.replace(value, "${oc.env:" + name + "}")
    return tree
