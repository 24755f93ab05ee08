"""Loading a config: read the YAML (a Trinity-RFT config translated, see `schemas.trinity`; in rftflow's own,
`${oc.env:NAME,default}` resolved, see `schemas.interpolation`, and relative paths made the file's folder's,
see `schemas.config_paths`), apply the `--set` overrides, and validate, naming the first refused key by its
dotted path. `schemas.config` defines the schema and `load_config` over these; this module takes the schema
as an argument, so the two import one way.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from schemas.bounded_yaml import parse_yaml, read_config_file
from schemas.config_paths import anchor_paths
from schemas.errors import InputError
from schemas.interpolation import env_values, resolve_env
from schemas.trinity import is_trinity, translate

# Trinity-RFT translation notices keep the logger they had before loading had a module of its own.
logger = logging.getLogger("schemas.config")
Model = TypeVar("Model", bound=BaseModel)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise InputError(f"cannot set '{dotted}': '{key}' is not a section", field=dotted)
        node = child
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=c` with c read as YAML, so numbers, booleans and null have their usual types."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InputError(f"expected key=value, got '{text}'", field="--set")
    return key.strip(), parse_yaml(raw, "--set", key.strip()) if raw.strip() else ""


def validated(schema: type[Model], tree: dict[str, Any], source: str) -> Model:
    """What a tree of plain values makes under `schema`; the first refusal is named by its dotted key."""
    try:
        return schema.model_validate(tree)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(f"{first['msg']}{more}", file=source, field=key or None) from None


def read_tree(path: Path | None, overrides: list[str] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The plain tree the file and the overrides make, before validation (paths in `--set`: the working
    directory's); and the values the file's `${oc.env:NAME}` references read (`Config.remember_env`)."""
    tree = read_config_file(Path(path)) if path is not None else {}
    env = env_values(tree)
    if is_trinity(tree):
        tree, notices = translate(tree, str(path))
        for notice in notices:
            logger.info("Trinity-RFT config %s: %s", path, notice)
    else:
        tree = resolve_env(tree, str(path))
        if path is not None:
            tree = anchor_paths(tree, Path(path).resolve().parent)
    for text in overrides or []:
        key, value = parse_override(text)
        _set_path(tree, key, value)
    tree = anchor_paths(tree, Path.cwd())  # what is still relative came from --set: saved absolute
    return tree, env
