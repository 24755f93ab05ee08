"""Per-request seeds derived from a run's base seed: a rerun of the same task samples the same responses,
whichever path (direct, multi-turn, or a session's HTTP calls) made the request."""

from __future__ import annotations

import hashlib


def derive_seed(base: int | None, *parts: object) -> int | None:
    """A per-request seed from the run's base seed, so a rerun of the same task samples the same responses."""
    if base is None:
        return None
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
