"""YAML read within bounds: a config is a page of settings, so reading one may not cost more than a page,
whatever the file holds (an "alias bomb" names 10^9 values in 10 lines; nesting can exhaust the stack).

The node graph is composed first and its expanded size counted, with each alias counted at every use, before
any Python object is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from schemas.errors import InputError, read_text

CONFIG_MAX_MIB = 1
YAML_MAX_NODES = 100_000  # values, each alias counted at every use: an "alias bomb" names 10^9 in 10 lines
YAML_MAX_DEPTH = 64


def expanded(node: yaml.Node, memo: dict[int, tuple[int, int]], path: set[int]) -> tuple[int, int]:
    """(values, depth) under `node` with every alias expanded, capped past the bounds; each node once."""
    if id(node) in memo:
        return memo[id(node)]
    if id(node) in path:
        raise yaml.YAMLError(f"an alias refers to a node that holds it (a cycle){node.start_mark}")
    path.add(id(node))
    value = node.value if isinstance(node, yaml.CollectionNode) else ()
    children = [n for pair in value for n in pair] if isinstance(node, yaml.MappingNode) else value
    sizes = [expanded(child, memo, path) for child in children]
    path.discard(id(node))
    size = min(1 + sum(n for n, _ in sizes), YAML_MAX_NODES + 1)
    memo[id(node)] = size, 1 + max((d for _, d in sizes), default=0)
    return memo[id(node)]


def parse_yaml(text: str, source: str, field: str | None = None) -> Any:
    """YAML (safe types only), refused before building anything if it nests or expands past the bounds."""
    loader = yaml.SafeLoader(text)
    loader.name = source  # the marks in its messages name the file, not "<unicode string>"
    try:
        node = loader.get_single_node()
        size, depth = expanded(node, {}, set()) if node is not None else (0, 0)
        if size <= YAML_MAX_NODES and depth <= YAML_MAX_DEPTH:
            return loader.construct_document(node) if node is not None else None
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of over 4300 digits
        raise InputError(f"not valid YAML: {exc}", file=source, field=field) from None
    except RecursionError:  # the composer recurses: nested far past YAML_MAX_DEPTH, refused below
        pass
    finally:
        loader.dispose()
    more = f"over {YAML_MAX_NODES} values or {YAML_MAX_DEPTH} levels, counting an alias (`*name`) at each use"
    raise InputError(
        f"YAML that expands to {more}: write it out, or use fewer aliases", file=source, field=field
    )


def read_config_file(path: Path) -> dict[str, Any]:
    """A YAML config file, bounded in size, nesting and alias expansion; every refusal names the file."""
    tree = parse_yaml(read_text(path, CONFIG_MAX_MIB, "config file"), str(path)) or {}
    if not isinstance(tree, dict):
        raise InputError("the top level must be a mapping", file=str(path))
    return tree
