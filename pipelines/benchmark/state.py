"""`<run dir>/bench_state.json`: what a benchmark run dir has measured, so a rerun skips it.

One record per (weights hash, taskset key), plus the MLflow parent run and a cache of weights hashes by file
size and mtime. Written atomically after every result, so a crash loses at most the result being measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.atomic import atomic_write_json
from schemas.errors import InputError
from schemas.run_dir import BENCH_STATE


class BenchState(BaseModel):
    """What a run dir has measured: one record per (weights, taskset, sampling), the parent run, hashes."""

    model_config = ConfigDict(extra="ignore")

    parent_run_id: str | None = None
    records: list[dict[str, Any]] = Field(default_factory=list)
    hash_cache: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def load(cls, run_dir: Path) -> BenchState:
        """The saved state, or a fresh one; a cut-off or foreign file is refused with its path."""
        path = Path(run_dir) / BENCH_STATE
        if not path.is_file():
            return cls()
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except (OSError, ValueError, ValidationError) as exc:
            reason = str(exc).splitlines()[0]
            raise InputError(
                f"unreadable benchmark state ({reason}); move it away to start afresh", file=str(path)
            ) from None

    def save(self, run_dir: Path) -> None:
        atomic_write_json(Path(run_dir) / BENCH_STATE, self.model_dump(mode="json"), indent=1, sort_keys=True)

    def find(self, weights: str, key: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r["weights_hash"] == weights and r["key"] == key), None)

    def put(self, record: dict[str, Any]) -> None:
        self.records = [
            r
            for r in self.records
            if not (r["weights_hash"] == record["weights_hash"] and r["key"] == record["key"])
        ]
        self.records.append(record)

    def child_of(self, path: Path, weights: str) -> str | None:
        """The child run already holding this checkpoint's results, to add a new taskset to it."""
        for r in self.records:
            if r["weights_hash"] == weights and r["checkpoint"] == str(path):
                return r.get("child_run_id")
        return None
