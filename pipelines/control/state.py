"""`RUN_DIR/explorer_state.json`: where a run stands, written atomically (never half a file)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_FILE = "explorer_state.json"


@dataclass
class ExplorerState:
    latest_step: int = 0  # last committed step
    task_index: int = 0  # tasks consumed: latest_step * batch_size, capped by the taskset
    mlflow_run_id: str | None = None
    model_version: int = 0
    last_sync_step: int = 0
    sync_failures: int = 0  # syncs that kept the old weights (refused, timed out or failed)
    published_step: int = 0  # last committed step handed to the experience queue (when there is one)

    @classmethod
    def load(cls, run_dir: Path) -> ExplorerState | None:
        path = Path(run_dir) / STATE_FILE
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError) as exc:
            raise RuntimeError(
                f"{path}: unreadable explorer state ({exc}); move it away to start afresh"
            ) from None

    def save(self, run_dir: Path) -> None:
        path = Path(run_dir) / STATE_FILE
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self), indent=2))
        os.replace(partial, path)
