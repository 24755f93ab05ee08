"""The serving front's durable record: sessions, the calls it served (as the engine sampled them), rewards,
and the commits that turned them into steps.

Every write is committed before the front acknowledges it (a call's answer, a reward's 200): SQLite in WAL
mode by default, or the database `serve.db_url` names. WAL with `synchronous=NORMAL` puts each commit in the
WAL file with a write, not a disk sync: the operating system holds it, so a SIGKILL of any process loses
nothing committed (a power loss could lose the last commits, which serve mode does not promise to survive).
A sync per commit cost tens of milliseconds a call on this machine's disk under load.

A commit is planned here (its step and its calls) before the sink writes it, and marked done after, so a
restart can finish or redo a commit that a crash cut, and never write a call twice
(`pipelines.serving.commits`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from pipelines.serving.group_commit import GroupCommit

METADATA = sa.MetaData()
SESSIONS = sa.Table(
    "serve_sessions",
    METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("api_key", sa.String(80), unique=True, nullable=True),
    sa.Column("kind", sa.String(16), nullable=False),  # session | sessionless
    sa.Column("state", sa.String(16), nullable=False),  # open | ended | expired | interrupted
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("ended", sa.Float, nullable=True),
)
CALLS = sa.Table(
    "serve_calls",
    METADATA,
    sa.Column("id", sa.String(128), primary_key=True),  # the response's `id`
    sa.Column("session_id", sa.String(64), nullable=False, index=True),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("route", sa.String(64), nullable=False),
    sa.Column("prompt_ids", sa.Text, nullable=False),
    sa.Column("response_ids", sa.Text, nullable=False),
    sa.Column("logprobs", sa.Text, nullable=False),
    sa.Column("model_version", sa.Integer, nullable=False),
    sa.Column("finish_reason", sa.String(32), nullable=False),
    sa.Column("reward", sa.Float, nullable=True),
    sa.Column("task_id", sa.String(128), nullable=True),  # Trinity's feedback groups calls by it
    sa.Column("step", sa.Integer, nullable=True),  # the committed step; -1: dropped unrewarded
    sa.Column("created", sa.Float, nullable=False),
)
COMMITS = sa.Table(
    "serve_commits",
    METADATA,
    sa.Column("step", sa.Integer, primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),  # planned | done
    sa.Column("call_ids", sa.Text, nullable=False),
    sa.Column("dropped_ids", sa.Text, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
)


@dataclass
class StoredCall:
    id: str
    session_id: str
    seq: int
    route: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    model_version: int
    finish_reason: str
    reward: float | None
    task_id: str | None


def durable_sqlite(engine: sa.Engine) -> None:
    """WAL, synced at checkpoints only: a committed write survives a SIGKILL of any process (module doc)."""

    @sa.event.listens_for(engine, "connect")
    def pragmas(connection: Any, _record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()


class RewardError(LookupError):
    """A reward the store cannot take; `status` is the HTTP status the front answers with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class ServeStore:
    def __init__(self, url: str):
        self.url = url
        self.engine = sa.create_engine(url, future=True)
        if url.startswith("sqlite"):
            durable_sqlite(self.engine)
        METADATA.create_all(self.engine)
        self.writer = GroupCommit(self.engine)  # one writer thread, one disk sync for every write waiting

    def close(self) -> None:
        self.writer.close()
        self.engine.dispose()

    # -- sessions -----------------------------------------------------------------------------------------

    def open_session(self, session_id: str, api_key: str | None, kind: str = "session") -> None:
        def write(db: sa.Connection) -> Any:
            db.execute(
                SESSIONS.insert().values(
                    id=session_id, api_key=api_key, kind=kind, state="open", created=time.time()
                )
            )

        return self.writer.run(write)

    def session_of_key(self, api_key: str) -> tuple[str, str] | None:
        """(session id, state) of the session holding `api_key`."""
        with self.engine.connect() as db:
            row = db.execute(sa.select(SESSIONS.c.id, SESSIONS.c.state).where(SESSIONS.c.api_key == api_key))
            found = row.first()
        return None if found is None else (found.id, found.state)

    def session_state(self, session_id: str) -> str | None:
        with self.engine.connect() as db:
            return db.execute(sa.select(SESSIONS.c.state).where(SESSIONS.c.id == session_id)).scalar()

    def end_session(self, session_id: str, state: str = "ended") -> bool:
        """End an open session; False when it was not open."""

        def write(db: sa.Connection) -> Any:
            done = db.execute(
                SESSIONS.update()
                .where(SESSIONS.c.id == session_id, SESSIONS.c.state == "open")
                .values(state=state, ended=time.time())
            )
            return done.rowcount == 1

        return self.writer.run(write)

    def interrupt_open_sessions(self) -> list[str]:
        """At start-up: the sessions a previous front left open; their keys stop working."""

        def write(db: sa.Connection) -> Any:
            ids = list(
                db.execute(
                    sa.select(SESSIONS.c.id).where(SESSIONS.c.state == "open", SESSIONS.c.kind == "session")
                ).scalars()
            )
            db.execute(
                SESSIONS.update()
                .where(SESSIONS.c.state == "open", SESSIONS.c.kind == "session")
                .values(state="interrupted", ended=time.time())
            )
            return ids

        return self.writer.run(write)

    # -- calls and rewards --------------------------------------------------------------------------------

    def record_call(self, call_id: str, session_id: str, record: dict[str, Any]) -> int:
        """Store a served call as the engine sampled it; its seq in the session."""

        def write(db: sa.Connection) -> Any:
            seq = db.execute(
                sa.select(sa.func.count()).select_from(CALLS).where(CALLS.c.session_id == session_id)
            ).scalar_one()
            db.execute(
                CALLS.insert().values(
                    id=call_id,
                    session_id=session_id,
                    seq=seq,
                    route=record["route"],
                    prompt_ids=json.dumps(record["prompt_ids"]),
                    response_ids=json.dumps(record["response_ids"]),
                    logprobs=json.dumps(record["logprobs"]),
                    model_version=record["model_version"],
                    finish_reason=record["finish_reason"] or "stop",
                    created=time.time(),
                )
            )
            return seq

        return self.writer.run(write)

    def last_call(self, session_id: str) -> str | None:
        with self.engine.connect() as db:
            query = sa.select(CALLS.c.id).where(CALLS.c.session_id == session_id).order_by(CALLS.c.seq.desc())
            return db.execute(query.limit(1)).scalar()

    def reward(
        self, call_ids: list[str], reward: float, session_id: str | None = None, task_id: str | None = None
    ) -> list[str]:
        """Set `reward` on each named call once; returns the calls it newly applied to (a repeat applies to
        none). RewardError(404) for a call the store does not hold (in `session_id`, when given)."""

        def write(db: sa.Connection) -> Any:
            query = sa.select(CALLS.c.id, CALLS.c.reward, CALLS.c.step).where(CALLS.c.id.in_(call_ids))
            if session_id is not None:
                query = query.where(CALLS.c.session_id == session_id)
            found = {row.id: row for row in db.execute(query)}
            missing = [c for c in call_ids if c not in found]
            if missing:
                where = " in this session" if session_id else ""
                raise RewardError(404, f"no served call {missing[0]!r}{where}")
            late = [c for c in call_ids if found[c].reward is None and found[c].step is not None]
            if late:
                raise RewardError(409, f"call {late[0]!r} was already committed unrewarded")
            new = [c for c in call_ids if found[c].reward is None]
            if new:
                db.execute(
                    CALLS.update().where(CALLS.c.id.in_(new)).values(reward=float(reward), task_id=task_id)
                )
            return new

        return self.writer.run(write)

    # -- commits --------------------------------------------------------------------------------------------

    def ready(self, unrewarded: str) -> tuple[list[StoredCall], list[str]]:
        """The calls a commit writes (rewarded, of ended sessions or sessionless; with `unrewarded: zero`
        also the unrewarded calls of ended sessions), and the unrewarded calls it drops (`drop`)."""
        closed = sa.select(SESSIONS.c.id).where(
            sa.or_(SESSIONS.c.kind == "sessionless", SESSIONS.c.state.in_(("ended", "expired")))
        )
        ended = sa.select(SESSIONS.c.id).where(SESSIONS.c.state.in_(("ended", "expired")))
        with self.engine.connect() as db:
            rows = db.execute(
                sa.select(CALLS)
                .where(CALLS.c.step.is_(None), CALLS.c.session_id.in_(closed))
                .order_by(CALLS.c.created, CALLS.c.session_id, CALLS.c.seq)
            ).all()
            unrewarded_ids = set(
                db.execute(
                    sa.select(CALLS.c.id).where(
                        CALLS.c.step.is_(None), CALLS.c.reward.is_(None), CALLS.c.session_id.in_(ended)
                    )
                ).scalars()
            )
        calls = [
            as_call(row)
            for row in rows
            if row.reward is not None or (row.id in unrewarded_ids and unrewarded == "zero")
        ]
        dropped = sorted(unrewarded_ids) if unrewarded == "drop" else []
        return calls, dropped

    def ready_sessions(self) -> int:
        """Ended sessions with a rewarded call not yet committed: what `commit_every_sessions` counts."""
        ended = sa.select(SESSIONS.c.id).where(SESSIONS.c.state.in_(("ended", "expired")))
        with self.engine.connect() as db:
            query = sa.select(sa.func.count(sa.distinct(CALLS.c.session_id))).where(
                CALLS.c.step.is_(None), CALLS.c.reward.is_not(None), CALLS.c.session_id.in_(ended)
            )
            return db.execute(query).scalar_one()

    def plan_commit(self, step: int, call_ids: list[str], dropped_ids: list[str]) -> None:
        def write(db: sa.Connection) -> Any:
            db.execute(
                COMMITS.insert().values(
                    step=step,
                    state="planned",
                    call_ids=json.dumps(call_ids),
                    dropped_ids=json.dumps(dropped_ids),
                    created=time.time(),
                )
            )

        return self.writer.run(write)

    def planned(self) -> list[tuple[int, list[str], list[str]]]:
        """Commits planned and not marked done (a crash cut them), oldest first."""
        with self.engine.connect() as db:
            rows = db.execute(sa.select(COMMITS).where(COMMITS.c.state == "planned").order_by(COMMITS.c.step))
            return [(r.step, json.loads(r.call_ids), json.loads(r.dropped_ids)) for r in rows]

    def calls(self, call_ids: list[str]) -> list[StoredCall]:
        with self.engine.connect() as db:
            rows = {r.id: r for r in db.execute(sa.select(CALLS).where(CALLS.c.id.in_(call_ids)))}
        return [as_call(rows[c]) for c in call_ids]

    def mark_committed(self, step: int, call_ids: list[str], dropped_ids: list[str]) -> None:
        def write(db: sa.Connection) -> Any:
            if call_ids:
                db.execute(CALLS.update().where(CALLS.c.id.in_(call_ids)).values(step=step))
            if dropped_ids:
                db.execute(CALLS.update().where(CALLS.c.id.in_(dropped_ids)).values(step=-1))
            db.execute(COMMITS.update().where(COMMITS.c.step == step).values(state="done"))

        return self.writer.run(write)

    def last_step(self) -> int:
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.max(COMMITS.c.step))).scalar() or 0

    def counts(self) -> dict[str, int]:
        """Totals for `/metrics`."""
        with self.engine.connect() as db:
            calls = db.execute(sa.select(sa.func.count()).select_from(CALLS)).scalar_one()
            rewarded = db.execute(
                sa.select(sa.func.count()).select_from(CALLS).where(CALLS.c.reward.is_not(None))
            ).scalar_one()
            committed = db.execute(
                sa.select(sa.func.count()).select_from(CALLS).where(CALLS.c.step > 0)
            ).scalar_one()
            dropped = db.execute(
                sa.select(sa.func.count()).select_from(CALLS).where(CALLS.c.step == -1)
            ).scalar_one()
            sessions = db.execute(
                sa.select(sa.func.count()).select_from(SESSIONS).where(SESSIONS.c.kind == "session")
            ).scalar_one()
        return {
            "calls": calls,
            "rewarded": rewarded,
            "committed": committed,
            "unrewarded": dropped,
            "sessions": sessions,
        }


def as_call(row: Any) -> StoredCall:
    return StoredCall(
        row.id,
        row.session_id,
        row.seq,
        row.route,
        json.loads(row.prompt_ids),
        json.loads(row.response_ids),
        json.loads(row.logprobs),
        row.model_version,
        row.finish_reason,
        row.reward,
        row.task_id,
    )
