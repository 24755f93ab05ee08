"""`RUN_DIR/explorer_state.json`: where a run stands, written atomically (never half a file), and how a
resumed run squares it with the steps its sink holds. On an object-store run dir it goes to the same store."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from operators.sinks.base import Sink
from schemas.atomic import atomic_write_json
from schemas.errors import InputError
from schemas.run_dir import CONFIG, EXPLORER_STATE
from schemas.storage import Location, as_location, display, is_file, join, read_bytes

STATE_FILE = EXPLORER_STATE


class ExplorerState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    latest_step: int = 0  # last committed step
    task_index: int = 0  # tasks consumed: latest_step * batch_size, capped by the taskset
    mlflow_run_id: str | None = None
    model_version: int = 0
    last_sync_step: int = 0
    sync_failures: int = 0  # syncs that kept the old weights (refused, timed out or failed)
    published_step: int = 0  # last committed step handed to the experience queue (when there is one)

    @classmethod
    def load(cls, run_dir: Location) -> ExplorerState | None:
        """The saved state, or None when there is none; InputError (naming it) for a file that is not one."""
        path = join(as_location(run_dir), STATE_FILE)
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
        atomic_write_json(join(as_location(run_dir), STATE_FILE), self.model_dump(), indent=2)


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
