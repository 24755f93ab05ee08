"""Parquet experience sink, committed per step.

Writers (Ray Data tasks) put fragments under `experiences/_pending/step_N/`; the driver commits a step once
all its tasks have reported, by renaming the step's directory to `experiences/step_N/` (atomic on one
filesystem). Only fragments named by a task record are kept, so a retried writer never duplicates rows.
Readers see committed steps only: `pyarrow.parquet.read_table(run_dir / "experiences")` skips `_pending`.
On an object store, which has no rename, the commit is a marker object instead
(`operators.sinks.object_store`); the fragment helpers here take either kind of location (`schemas.storage`).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow.fs import FileType

from schemas.atomic import atomic_open, atomic_replace
from schemas.experience import EXPERIENCE_SCHEMA, conform
from schemas.run_dir import PENDING, STEP_GLOB, STEP_PREFIX, step_dir_name
from schemas.status import FILTERED_TYPE, RESULT_SCHEMA, flatten_experiences
from schemas.storage import Location, as_location, children, delete_file, join, make_dirs, open_input

# A result row without its experiences (written to the fragment) and with the fragment's name instead, and
# what the experience ops dropped of them (empty without ops).
RECORD_SCHEMA = pa.schema(
    [f for f in RESULT_SCHEMA if f.name not in ("metric", "runner", "experiences")]
    + [pa.field("num_experiences", pa.int64()), pa.field("fragment", pa.string())]
    + [pa.field("filtered", FILTERED_TYPE)]
)


step_dirname = step_dir_name  # the old name, kept for callers


def write_fragments(results: pa.Table, root: str) -> pa.Table:
    """Ray Data map stage: write each step's experiences as a pending fragment; return a record per row.

    A record per result row, i.e. per sub-run `(task_uid, run_id_base)` when a task's repeats are split; a
    `filtered` column (the experience ops' counts, `operators.ops.stage`) is carried into the records.
    """
    records = results.select([n for n in RECORD_SCHEMA.names if n in results.column_names])
    counts = pc.list_value_length(results.column("experiences")).cast(pa.int64())
    fragments: list[str | None] = [None] * len(results)
    steps = results.column("step").to_pylist()
    for step in sorted(set(steps)):
        rows = [i for i, s in enumerate(steps) if s == step]
        experiences = flatten_experiences(results.take(rows))
        if not len(experiences):
            continue
        directory = join(as_location(root), PENDING, step_dir_name(step))
        make_dirs(directory)
        fragment = f"part-{uuid.uuid4().hex}.parquet"
        with atomic_open(join(directory, fragment)) as f:
            pq.write_table(experiences, f)
        for i in rows:
            fragments[i] = fragment if counts[i].as_py() else None
    records = records.append_column("num_experiences", counts).append_column(
        "fragment", pa.array(fragments, pa.string())
    )
    if "filtered" not in records.column_names:
        records = records.append_column("filtered", pa.array([[]] * len(records), FILTERED_TYPE))
    return records.select(RECORD_SCHEMA.names).cast(RECORD_SCHEMA)


def filter_stale(table: pa.Table, min_version: int | None) -> tuple[pa.Table, int]:
    """`table` without experiences older than `min_version` (the staleness bound), and how many went."""
    if min_version is None:
        return table, 0
    kept = table.filter(pc.greater_equal(table.column("model_version"), min_version))
    return kept, len(table) - len(kept)


def read_parquet(location: Location, columns: list[str] | None = None) -> pa.Table:
    with open_input(location) as f:
        return pq.read_table(f, columns=columns)


def drop_stale(path: Location, min_version: int) -> int:
    """Rewrite a pending fragment without experiences older than `min_version`; returns how many went."""
    versions = read_parquet(path, columns=["model_version"]).column("model_version")
    stale = pc.sum(pc.less(versions, min_version)).as_py() or 0
    if stale:
        kept, _ = filter_stale(read_parquet(path), min_version)
        with atomic_open(path) as f:
            pq.write_table(kept, f)
    return stale


def drop_stale_fragments(pending: Location, fragments: set[str], min_version: int | None) -> int:
    """`drop_stale` on each named fragment of a pending folder; returns how many experiences went."""
    if min_version is None:
        return 0
    return sum(drop_stale(join(pending, name), min_version) for name in fragments)


def pending_fragments(root: Location, step: int, fragments: set[str]) -> Location:
    """The pending folder of `step`, holding exactly the named fragments.

    Files no record names (a retried writer's second copy, a partial file) are removed; a named fragment
    that is not there is an error, since its experiences would be lost.
    """
    pending = join(root, PENDING, step_dir_name(step))
    make_dirs(pending)
    present = set(children(pending, FileType.File))
    missing = fragments - present
    if missing:
        raise RuntimeError(f"step {step}: fragments reported but not on disk: {sorted(missing)}")
    for name in present - fragments:
        delete_file(join(pending, name))
    return pending


def read_fragments(paths: list[Location]) -> pa.Table:
    """Fragments in the order given, as one table (empty, with the experience schema, for none)."""
    if not paths:
        return EXPERIENCE_SCHEMA.empty_table()
    return pa.concat_tables(conform(read_parquet(p)) for p in paths)


class ParquetSink:
    """Driver side of the sink: commit and read steps."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def close(self) -> None:
        """Nothing to let go of: every call opens and closes its own files."""

    def committed_steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(p.name.removeprefix(STEP_PREFIX)) for p in self.root.glob(STEP_GLOB) if p.is_dir())

    def commit_step(self, step: int, fragments: set[str], min_version: int | None = None) -> int:
        """Keep exactly the named fragments of `step` and publish them in one rename.

        Experiences generated by a model version below `min_version` (the staleness bound) are dropped from
        the fragments first; returns how many were dropped.
        """
        final = self.root / step_dir_name(step)
        if final.exists():
            raise RuntimeError(f"step {step} is already committed at {final}")
        pending = pending_fragments(self.root, step, fragments)
        dropped = drop_stale_fragments(pending, fragments, min_version)
        atomic_replace(pending, final)
        return dropped

    def read_step(self, step: int) -> pa.Table:
        return read_fragments(sorted((self.root / step_dir_name(step)).glob("*.parquet")))

    def discard_pending(self) -> None:
        shutil.rmtree(self.root / PENDING, ignore_errors=True)

    def describe(self) -> str:
        return f"{self.root} (Parquet, one folder per committed step)"
