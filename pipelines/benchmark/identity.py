"""What identifies a benchmark result: the weights (sha256), the taskset (settings and bytes), the sampling.

A result is reused only when all three match, so a rerun skips what it measured, a copy of a checkpoint under
another path is skipped too, and a changed taskset or sampling setting is measured again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from operators.tasks.rows import taskset_files
from schemas.config import TasksetConfig

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "seed")


def sampling_of(taskset: TasksetConfig) -> dict[str, Any]:
    """The settings that change what is sampled: a result measured under others is not reused."""
    args = taskset.rollout_args.model_dump(mode="json")
    return {**{k: args[k] for k in SAMPLING_FIELDS}, "repeat_times": taskset.repeat_times}


def taskset_key(taskset: TasksetConfig, workflow: str) -> str:
    """Name, settings, workflow and the taskset files' bytes: a changed taskset is measured again. A
    reasoning-gym taskset has no files: its settings (dataset, args, size, seed) say what it generates."""
    digest = hashlib.sha256()
    settings = taskset.model_dump(mode="json")
    settings.pop("path")
    digest.update(json.dumps([settings, workflow], sort_keys=True).encode())
    for path in taskset_files(taskset) if taskset.reasoning_gym is None else ():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
