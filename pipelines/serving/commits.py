"""Turning served, rewarded calls into a committed step, exactly once.

A commit takes what the store says is ready (`ServeStore.ready`), plans it in the store (step N, its calls),
writes the step through the run's sink as explore mode does (the same experience schema, keys and experience
ops; a pending fragment of a fixed name, then `commit_step`), and marks it done. A crash anywhere in between
leaves a planned commit, which `Committer.recover` finishes at start-up: if the sink holds step N already it
is only marked, otherwise it is written again from the same calls. So no acknowledged reward is lost and no
experience is written twice.

Experiences: `serve.trajectory: per_call` (the default) makes one per call, with its own reward and key
(`serve/<session>`, run id = the call's place in its session); `merge` makes a session's calls one trajectory
where each extends the last (as agent runs do), with the session's last reward. Sessionless calls rewarded by
Trinity's `/feedback` are keyed by the `task_id` it sent, so a trainer groups them as it would a task's runs.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from operators.ops.stage import ExperienceOps
from operators.sinks.base import Sink
from operators.workflows.trajectory import Call, assemble, segment_experiences
from pipelines.serving.store import ServeStore, StoredCall
from schemas.atomic import atomic_open
from schemas.experience import Experience, experiences_to_table
from schemas.run_dir import PENDING, step_dir_name
from schemas.serve_config import ServeConfig
from schemas.task import Task

log = logging.getLogger(__name__)
TASKSET = "serve"


def fragment_name(step: int) -> str:
    """The one fragment a serve step has: a fixed name, so a rewrite after a crash replaces it."""
    return f"part-serve-{step:06d}.parquet"


def serve_task(group: str, step: int) -> Task:
    return Task(
        f"{TASKSET}/{group}", TASKSET, 0, 0, step, truth="", workflow="serve", reward_fn="", prompt=""
    )


def as_trajectory_call(call: StoredCall) -> Call:
    return Call(call.prompt_ids, call.response_ids, call.logprobs, call.model_version, call.finish_reason)


class Committer:
    def __init__(
        self, store: ServeStore, sink: Sink, settings: ServeConfig, ops: list[dict[str, Any]], tokenizer: Any
    ):
        self.store, self.sink, self.settings = store, sink, settings
        self.ops = ExperienceOps(ops)
        self.tokenizer = tokenizer

    def recover(self) -> list[int]:
        """Finish the commits a crash cut; the steps it finished."""
        done = []
        committed = set(self.sink.committed_steps())
        for step, call_ids, dropped_ids in self.store.planned():
            if step not in committed:
                self.write(step, self.store.calls(call_ids))
            self.store.mark_committed(step, call_ids, dropped_ids)
            done.append(step)
        return done

    def commit(self) -> dict[str, Any]:
        """Commit what is ready as the next step; `{"step": N, "experiences": k, ...}`, or step None when
        nothing was ready."""
        calls, dropped = self.store.ready(self.settings.unrewarded)
        if not calls and not dropped:
            return {"step": None, "experiences": 0, "dropped_unrewarded": 0}
        step = max(self.store.last_step(), *self.sink.committed_steps(), 0) + 1
        ids = [c.id for c in calls]
        self.store.plan_commit(step, ids, dropped)
        written = self.write(step, calls) if calls else 0
        self.store.mark_committed(step, ids, dropped)
        log.info(
            "step %d committed: %d experience(s) from %d call(s), %d unrewarded dropped",
            step,
            written,
            len(calls),
            len(dropped),
        )
        return {"step": step, "experiences": written, "calls": len(calls), "dropped_unrewarded": len(dropped)}

    def write(self, step: int, calls: list[StoredCall]) -> int:
        """Write `calls` as step `step` through the sink; the experiences written."""
        experiences = self.experiences(step, calls)
        table, _ = self.ops.apply(experiences_to_table(experiences))
        pending = Path(self.sink.root) / PENDING / step_dir_name(step)
        pending.mkdir(parents=True, exist_ok=True)
        name = fragment_name(step)
        with atomic_open(pending / name) as f:
            pq.write_table(table, f)
        if step not in self.sink.committed_steps():
            self.sink.commit_step(step, {name})
        return table.num_rows

    def experiences(self, step: int, calls: list[StoredCall]) -> list[Experience]:
        groups: dict[str, list[StoredCall]] = defaultdict(list)
        for call in calls:
            groups[call.task_id or call.session_id].append(call)
        out: list[Experience] = []
        for group, members in groups.items():
            task = serve_task(group, step)
            if self.settings.trajectory == "merge":
                out += self.merged(task, members)
                continue
            for call in members:  # run id: the call's place in its session, unique across steps
                segments = assemble([as_trajectory_call(call)], "per_call")
                out += segment_experiences(
                    task, call.seq, segments, self.texts(segments), call.reward or 0.0, {}
                )
        return out

    def merged(self, task: Task, calls: list[StoredCall]) -> list[Experience]:
        by_session: dict[str, list[StoredCall]] = defaultdict(list)
        for call in calls:
            by_session[call.session_id].append(call)
        out: list[Experience] = []
        for members in by_session.values():
            members = sorted(members, key=lambda c: c.seq)
            segments = assemble([as_trajectory_call(c) for c in members], "merge")
            run_id = members[0].seq
            reward = next((c.reward for c in reversed(members) if c.reward is not None), 0.0)
            out += segment_experiences(task, run_id, segments, self.texts(segments), reward, {})
        return out

    def texts(self, segments: list[Any]) -> list[tuple[str, str]]:
        decode = self.tokenizer.decode
        return [(decode(s.prompt_ids), decode(s.response_ids)) for s in segments]
