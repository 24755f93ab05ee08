"""Parquet experience sink on an object store (S3, GCS, ...), committed per step by a marker object.

Writers put fragments under `experiences/_pending/step_N/` as on a disk. An object store cannot rename a
folder, so the driver commits a step in three moves:
1. the named fragments are copied (server side) to `experiences/step_N/`, any files there first removed;
2. the marker `experiences/step_N/_COMMITTED`, listing those fragments, is written, last: this is the commit;
3. the pending folder is removed.
A step is committed exactly when its marker exists, and it holds exactly the files its marker lists. A crash
before 2 leaves a folder without a marker: no reader (`committed_steps`, `read_step`, the trainer's reader,
resume) sees it, and the resumed run removes it and redoes the step, so no experience is written twice.
Plain dataset readers (`pyarrow.dataset` on the prefix) do not know the marker: read through
`operators.sinks.reader`.
"""

from __future__ import annotations

import pyarrow as pa
from pyarrow.fs import FileType

from operators.sinks.parquet import drop_stale_fragments, pending_fragments, read_fragments
from schemas.atomic import COMMIT_MARKER, committed_files, write_commit_marker
from schemas.run_dir import PENDING, STEP_PREFIX, step_dir_name
from schemas.storage import children, copy_file, delete_tree, display, filesystem, join


def step_number(folder: str) -> int | None:
    """N for a folder named `step_N`, else None."""
    digits = folder.removeprefix(STEP_PREFIX)
    return int(digits) if folder.startswith(STEP_PREFIX) and digits.isdigit() else None


class MarkedParquetSink:
    """Driver side of the object-store sink: commit steps by marker, and read the committed ones."""

    def __init__(self, root: str):
        self.root = root

    def close(self) -> None:
        """Nothing to let go of: every call opens and closes its own objects."""

    def step_folders(self) -> dict[int, str]:
        """Every `step_N` folder under the root, committed or not."""
        found = {name: step_number(name) for name in children(self.root, FileType.Directory)}
        return {step: name for name, step in found.items() if step is not None}

    def committed_steps(self) -> list[int]:
        folders = self.step_folders()
        fs, path = filesystem(self.root)
        markers = fs.get_file_info([f"{path}/{name}/{COMMIT_MARKER}" for name in folders.values()])
        return sorted(step for step, info in zip(folders, markers, strict=True) if info.type == FileType.File)

    def commit_step(self, step: int, fragments: set[str], min_version: int | None = None) -> int:
        """Copy exactly the named fragments of `step` into its folder, then write its marker.

        Experiences older than `min_version` (the staleness bound) are dropped from the fragments first;
        returns how many were dropped.
        """
        final = join(self.root, step_dir_name(step))
        if committed_files(final) is not None:
            raise RuntimeError(f"step {step} is already committed at {display(final)}")
        pending = pending_fragments(self.root, step, fragments)
        dropped = drop_stale_fragments(pending, fragments, min_version)
        delete_tree(final)  # what a crashed commit of this step copied: never published, never read
        for name in sorted(fragments):
            copy_file(join(pending, name), join(final, name))
        write_commit_marker(final, fragments)
        delete_tree(pending)
        return dropped

    def read_step(self, step: int) -> pa.Table:
        final = join(self.root, step_dir_name(step))
        names = committed_files(final)
        if names is None:
            raise KeyError(f"step {step} has no commit marker in {display(self.root)}")
        return read_fragments([join(final, name) for name in names])

    def discard_pending(self) -> None:
        """Drop pending fragments, and step folders a crash left without a marker: their tasks run again."""
        delete_tree(join(self.root, PENDING))
        committed = set(self.committed_steps())
        for step, name in self.step_folders().items():
            if step not in committed:
                delete_tree(join(self.root, name))

    def describe(self) -> str:
        marker = f"a step committed by its {COMMIT_MARKER} object"
        return f"{display(self.root)} (Parquet on an object store, {marker})"
