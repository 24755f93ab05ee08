"""`RUN_DIR/explorer_state.json`: where a run stands, written atomically (never half a file), and how a
resumed run squares it with the steps its sink holds; and `carried_tasks.json`, what a crash may have lost.
On an object-store run dir both go to the same store."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from operators.sinks.base import Sink
from schemas.atomic import atomic_write_json
from schemas.errors import InputError
from schemas.run_dir import CARRIED_TASKS, CONFIG, RunDir
from schemas.storage import Location, as_location, display, is_file, join, read_bytes


class ExplorerState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latest_step: int = 0  # last committed step
    task_index: int = 0  # tasks consumed: latest_step * batch_size, capped by the taskset
    mlflow_run_id: str | None = None
    model_version: int = 0
    last_sync_step: int = 0
    sync_failures: int = 0  # syncs that kept the old weights (refused, timed out or failed)
    published_step: int = 0  # last committed step handed to the experience queue (when there is one)
    # a scheduled run's taskset scheduler (selectors, feedback not yet applied), as of `latest_step`
    selector_state: dict[str, Any] | None = None

    @classmethod
    def load(cls, run_dir: Location) -> ExplorerState | None:
        """The saved state, or None when there is none; InputError (naming it) for a file that is not one."""
        path = RunDir(run_dir).explorer_state
        try:
            if not is_file(path):
                return None
            return cls.model_validate_json(read_bytes(path))
        except OSError as exc:
            raise InputError(
                f"explorer state cannot be read ({exc.strerror or exc})", file=display(path)
            ) from None
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in exc.errors()[:3]
            )
            raise InputError(
                f"unreadable explorer state ({problems}); move it away to start afresh in a new MLflow run, "
                "or restore it",
                file=display(path),
            ) from None

    def save(self, run_dir: Location) -> None:
        atomic_write_json(RunDir(run_dir).explorer_state, self.model_dump(), indent=2)


def resume_state(run_dir: Location, sink: Sink) -> ExplorerState:
    """The saved state, reconciled with the sink: the committed steps are the truth."""
    state = ExplorerState.load(run_dir) or ExplorerState()
    committed = sink.committed_steps()
    if committed and state.mlflow_run_id is None:
        raise InputError(
            "holds committed steps but no explorer state; use a new --run-dir", file=display(run_dir)
        )
    if state.latest_step and not committed:
        saved = display(join(as_location(run_dir), CONFIG))
        raise InputError(
            f"its state says step {state.latest_step} is committed, but {sink.describe()} holds no step: "
            f"give buffer.trainer_input.experience_buffer as in {saved}, "
            "or use a new --run-dir",
            file=display(run_dir),
        )
    if committed:
        state.latest_step = max(committed)
    return state


def save_carried(run_dir: Location, step: int, task_uids: list[str]) -> None:
    """Before `step` commits: the tasks it moves on to the next step, still sampling (over-rollout `recycle`).

    Written before the commit, so the file of the last committed step is always there; a later step's
    (written, then a crash before its commit) is told apart by its step."""
    atomic_write_json(join(as_location(run_dir), CARRIED_TASKS), {"step": step, "task_uids": task_uids})


def lost_carried(run_dir: Location, latest_step: int) -> list[str]:
    """The tasks the last committed step moved on that no committed step holds: a crash ended them with the
    run that sampled them (their output was in its engines), and a resumed run does not run them again."""
    path = join(as_location(run_dir), CARRIED_TASKS)
    if not latest_step or not is_file(path):
        return []
    saved = json.loads(read_bytes(path))
    return list(saved["task_uids"]) if saved["step"] == latest_step else []
