"""Trinity-RFT configs, recognised by their own keys and translated to rftflow's, so a migrating user brings
the YAML as it is.

What each key becomes is the table in `schemas.trinity_keys`: mapped, ignored with a notice giving the reason,
or refused naming it, as is any key Trinity-RFT 0.6 does not know (Trinity's own schema refuses those too).
OmegaConf interpolation (`${oc.env:VAR,default}`, `${a.b}`) is resolved with OmegaConf itself first.
"""

from __future__ import annotations

from typing import Any

from schemas.interpolation import resolve
from schemas.trinity_keys import TRINITY
from schemas.trinity_rules import Translation

# not `mode`: rftflow's own configs have it too (explore | bench)
MARKERS = ("algorithm", "cluster", "trainer", "checkpoint_root_dir", "data_processor", "service")


def section(tree: Any, *keys: str) -> dict[str, Any]:
    for key in keys:
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree if isinstance(tree, dict) else {}


def is_trinity(tree: dict[str, Any]) -> bool:
    """A Trinity-RFT config: it has a key, or a value, only Trinity's configs have."""
    inputs = section(tree, "buffer", "explorer_input")
    experience_buffer = section(tree, "buffer", "trainer_input", "experience_buffer")
    return (
        any(k in tree for k in MARKERS)
        or "max_response_tokens" in section(tree, "model")
        or "storage_type" in section(inputs, "taskset")
        or any(isinstance(t, dict) and "storage_type" in t for t in inputs.get("tasksets") or ())
        or experience_buffer.get("storage_type") in ("queue", "file")
    )


def translate(tree: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """rftflow's config tree for a Trinity-RFT one, and the notices about what was ignored or changed."""
    translation = Translation(resolve(tree, source), source)
    translation.walk(TRINITY, translation.src, "", "")
    given = section(translation.src, "buffer", "explorer_input")
    if "tasksets" in given and "taskset" not in given:  # the absent `taskset` was walked for its defaults
        section(translation.out, "buffer", "explorer_input").pop("taskset", None)
    return translation.out, translation.notices
