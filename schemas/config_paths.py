"""Relative paths in a config file are relative to that file's folder, as most tools read them.

So `pipelines/tool_math.yaml` names `assets/tiny-tool-llama` and works from any working directory, and a
config next to its taskset can say `path: train.jsonl`. Paths given on the command line (`--set`,
`--plugin-dir`, `--run-dir`) stay relative to the working directory, where the shell that typed them stands.
A Trinity-RFT config keeps Trinity's rule (the working directory), so it means here what it meant there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# The config's path keys (dotted; `*` is each item of a list): every `GivenPath` field of `schemas.config`.
PATH_KEYS = (
    "model.model_path",
    "model.lora.path",
    "buffer.explorer_input.taskset.path",
    "buffer.explorer_input.tasksets.*.path",
    "buffer.explorer_input.eval_tasksets.*.path",
    "synchronizer.checkpoint_dir",
    "plugin_dirs.*",
)


def anchored(value: Any, base: Path) -> Any:
    """`value` joined to `base` when it is a relative path (`~` expanded first); anything else as it is."""
    if not isinstance(value, str | os.PathLike) or not str(value).strip() or "://" in str(value):
        return value  # an empty path or a URI is refused or read elsewhere, as given
    path = Path(value).expanduser()
    return value if path.is_absolute() else str(base / path)


def anchor_paths(tree: Any, base: Path) -> Any:
    """`tree` (a config file's values) with each relative path under `PATH_KEYS` made relative to `base`."""
    for key in PATH_KEYS:
        tree = anchor_key(tree, key.split("."), base)
    return tree


def anchor_key(node: Any, parts: list[str], base: Path) -> Any:
    if not parts:
        return anchored(node, base)
    head, rest = parts[0], parts[1:]
    if head == "*":
        return [anchor_key(item, rest, base) for item in node] if isinstance(node, list) else node
    if not isinstance(node, dict) or head not in node:
        return node
    return {**node, head: anchor_key(node[head], rest, base)}
