"""The experience sink's contract, and the sink a run's config asks for.

Every sink stages the same way: rollout batches write Parquet fragments under
`<run dir>/experiences/_pending/` (`operators.sinks.parquet.write_fragments`), and the driver commits each
step once, in order. The sinks differ only in where a committed step lives: a `step_N/` folder (Parquet) or
rows in two SQL tables.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from operators.sinks.object_store import MarkedParquetSink
from operators.sinks.parquet import ParquetSink
from operators.sinks.sql import SqlSink
from schemas.config import SQL_NAME_MAX, ExperienceBufferConfig
from schemas.errors import InputError
from schemas.run_dir import EXPERIENCES, RunDir
from schemas.storage import Location, as_location, base_name, display, is_remote, join

STAGING = EXPERIENCES  # under the run dir: Parquet's committed steps, and every sink's pending fragments


class Sink(Protocol):
    """What the control stage and the readers need from a sink."""

    root: Location  # the staging root, where writers put pending fragments (a Path, or an object-store URI)

    def committed_steps(self) -> list[int]: ...

    def commit_step(self, step: int, fragments: set[str], min_version: int | None = None) -> int:
        """Commit exactly the named fragments of `step`, once; returns the experiences dropped as stale."""
        ...

    def read_step(self, step: int) -> pa.Table:
        """A committed step's experiences (EXPERIENCE_SCHEMA)."""
        ...

    def discard_pending(self) -> None: ...

    def close(self) -> None:
        """Let go of connections and files (the run is over; readers open their own)."""
        ...

    def describe(self) -> str:
        """Where the committed steps are, for the run summary (passwords masked)."""
        ...


def default_table_name(run_name: str) -> str:
    """The run name as a plain SQL identifier; a long one is cut and keeps a hash, so runs stay apart."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", run_name)
    if not re.match(r"[A-Za-z_]", name):
        name = f"run_{name}"
    if len(name) > SQL_NAME_MAX:
        digest = hashlib.sha1(run_name.encode()).hexdigest()[:8]
        name = f"{name[: SQL_NAME_MAX - 9]}_{digest}"
    return name


SQL_PATH_KEY = "buffer.trainer_input.experience_buffer.path"


def open_sink(cfg: ExperienceBufferConfig, run_dir: Location) -> Sink:
    """The sink of the run in `run_dir` (whose name is the run name); nothing is opened until first used.

    On an object store the Parquet sink commits by marker (`operators.sinks.object_store`), and the SQL sink
    needs a database URL: its default, a SQLite file in the run dir, needs a local disk.
    """
    remote = is_remote(run_dir)
    run_dir = as_location(run_dir) if remote else Path(run_dir).resolve()
    root = join(run_dir, STAGING)
    if cfg.storage_type == "parquet":
        return MarkedParquetSink(str(root)) if remote else ParquetSink(root)
    if cfg.path is None and remote:
        raise InputError(
            f"the SQL sink's default is a SQLite file in the run dir, and {display(run_dir)} is on an object "
            "store: give a database URL (e.g. postgresql+psycopg://...)",
            field=SQL_PATH_KEY,
        )
    url = cfg.path or RunDir(run_dir).experiences_db_url
    return SqlSink(root, url, cfg.name or default_table_name(base_name(run_dir)))
