"""The driver's side of a scheduled run: it draws each step's tasks as the feedback they depend on commits,
posts them to the step gate for the read, turns each committed step into feedback, and keeps the scheduler's
state resumable.

A resumed run loads the scheduler state saved with its last explorer state, then replays the steps the sink
committed after it (a crash may come between a commit and the state's save): it draws them again, which
gives the same picks, and feeds back what the sink holds for them. So only committed feedback is ever
applied, and the run goes on drawing exactly what an uninterrupted one would.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from operators.actors.names import get_within
from operators.sinks.base import Sink
from operators.tasks.scheduled import ScheduledTasks
from operators.tasks.scheduler import Feedback, Pick

log = logging.getLogger(__name__)


def task_feedback(experiences: pa.Table, picked: dict[str, Pick]) -> Feedback:
    """Each picked task's mean reward (a pass rate, clipped to [0, 1] by the selector), by taskset."""
    if not len(experiences):
        return {}
    grouped = experiences.group_by("task_uid").aggregate([("reward", "mean")])
    out: Feedback = {}
    for uid, reward in zip(
        grouped.column("task_uid").to_pylist(), grouped.column("reward_mean").to_pylist(), strict=True
    ):
        pick = picked.pop(uid, None)
        if pick is not None and reward is not None:
            rows, values = out.setdefault(pick.taskset, ([], []))
            rows.append(pick.row)
            values.append(float(reward))
    return out


class Feeder:
    """Draws and posts steps up to what the gate may release; one per explorer run."""

    def __init__(self, tasks: ScheduledTasks):
        self.tasks = tasks
        # step -> task uid -> its pick, until that step's feedback is given. A task's feedback counts only
        # from the step it was drawn for: over-rollout's `recycle` moves a cut task on to the next step, and
        # a crash loses such a task (it is not run again), so an uninterrupted run must do without its
        # feedback too, or a resumed run would draw differently from it.
        self.picked: dict[int, dict[str, Pick]] = {}

    @property
    def scheduler(self):
        return self.tasks.scheduler

    def restore(self, saved: dict[str, Any] | None, sink: Sink, latest_step: int) -> dict[str, Any] | None:
        """Resume after committed step `latest_step`: the saved state, then the committed steps after it;
        returns the state as of `latest_step` (None for a fresh run)."""
        if saved is not None:
            self.scheduler.load_state_dict(saved)
        for step in range(self.scheduler.next_step, latest_step + 1):
            self.draw(step)
            self.scheduler.feedback(step, task_feedback(sink.read_step(step), self.picked.pop(step, {})))
            self.scheduler.figures.pop(step, None)
        return self.scheduler.checkpoint(latest_step) if latest_step else None

    def draw(self, step: int) -> pa.Table:
        table, picks = self.tasks.step_table(step)
        self.picked[step] = dict(zip(table.column("task_uid").to_pylist(), picks, strict=True))
        return table

    def feed(self, gate: Any, upto: int, committed: int) -> int:
        """Draw and post every step up to `upto` whose feedback is in; returns the last step posted."""
        scheduler, last = self.scheduler, self.tasks.plan.num_steps
        tables = {}
        while scheduler.next_step <= min(upto, last) and scheduler.can_draw(scheduler.next_step):
            step = scheduler.next_step
            tables[step] = self.draw(step)
        if tables:
            get_within(gate.post.remote(tables, committed), "the step gate (post tasks)")
        return scheduler.next_step - 1

    def committed(self, step: int, experiences: pa.Table) -> tuple[dict[str, Any], dict[str, float]]:
        """Give committed step `step`'s feedback; its checkpoint to save, and its selectors' figures."""
        self.scheduler.feedback(step, task_feedback(experiences, self.picked.pop(step, {})))
        figures = {}
        for key, value in self.scheduler.figures.pop(step, {}).items():
            index, _, name = key.partition("/")
            figures[f"selector/{self.tasks.names[int(index)]}/{name}"] = value
        for name in self.tasks.names:
            drawn = pc.sum(pc.equal(experiences.column("taskset"), name)).as_py() if len(experiences) else 0
            figures[f"selector/{name}/experiences"] = float(drawn or 0)
        return self.scheduler.checkpoint(step), figures
