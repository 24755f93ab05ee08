"""The mark an explorer leaves when its run has committed its last step, so a following reader can stop.

A reader that follows a run (`operators.sinks.reader`) cannot tell a finished run from a slow one by its
commits alone: without this mark it waits out its whole idle timeout. The explorer writes the mark after the
last step commits, and removes it when the run resumes with steps left (a raised `total_steps`), before any
new step can commit. A reader that sees the mark, then lists the committed steps, has seen every step.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from schemas.atomic import atomic_write_json
from schemas.run_dir import FINISHED
from schemas.storage import Location, as_location, delete_file, display, is_file, join, read_bytes


def finished_path(run_dir: Location) -> Location:
    return join(as_location(run_dir), FINISHED)


def mark_finished(run_dir: Location, last_step: int) -> None:
    """The run is over: every step up to `last_step` is committed, and no other will be."""
    atomic_write_json(finished_path(run_dir), {"last_step": last_step, "finished_at": time.time()})


def clear_finished(run_dir: Location) -> None:
    """The run goes on (a resume with steps left): followers wait for its new steps again."""
    if is_file(finished_path(run_dir)):
        delete_file(finished_path(run_dir))


def reopen(run_dir: Location, latest_step: int, num_steps: int) -> bool:
    """Before a run starts or resumes: False for a finished run with no step left, which stays finished;
    else True, its mark removed, so followers wait for its new steps. (A crash after the last commit leaves no
    mark: that run goes on, for the eval or sync its last step may have missed.)"""
    if latest_step >= num_steps and finished_step(run_dir) is not None:
        return False
    clear_finished(run_dir)
    return True


def finished_step(run_dir: Location) -> int | None:
    """The last step of a finished run; None while the run may still commit steps (or never ran)."""
    path = finished_path(run_dir)
    if not is_file(path):
        return None
    try:
        return int(json.loads(read_bytes(path))["last_step"])
    except (ValueError, KeyError, TypeError):  # a mark not written by rftflow: no end is known
        return None


@dataclass
class NothingLeft:
    """What `python -m pipelines.explore` says of a finished run given again (same total steps): nothing was
    started (`reopen` said so before Ray or an engine could)."""

    steps: int
    run_dir: Location

    def render(self) -> str:
        return (
            f"rftflow explore: {display(self.run_dir)} has committed all its {self.steps} steps; nothing was "
            "started (raise buffer.total_steps, or --steps, to go on)"
        )
