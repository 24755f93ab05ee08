"""Sessions: what an engine records of the calls one agent run makes over HTTP, and the run's limits.

A run opens a session on the engine its task went to and gets a random key. The agent uses that key as its
API key (`Authorization: Bearer KEY`), and needs nothing else from rftflow: a base URL, the key and the model
name. The engine records every call made under the key, through any admitted route, as it sampled it
(`operators.engine.recording_llm`): prompt ids, completion ids, the sampled tokens' logprobs, and the version
at dispatch. The run collects the calls in order when it ends, which drops the session; a session nobody
collects (its run's process died) is dropped after `IDLE_S` without a call.

The run's limits hold here, so an agent that ignores them is cut off: once `max_turns` calls were made, or the
last call filled the trajectory budget, a further call is refused, naming the limit, and the session
remembers why it stopped. Each call's `max_tokens` is cut to the room left in the budget.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from operators.engine.seeds import derive_seed

KEY_PREFIX = "rft-"
IDLE_S = 3600.0  # a session without a call for this long is dropped: its run is gone


class SessionRefused(Exception):
    """A call the session does not admit; `status` is the HTTP status the gate answers with."""

    def __init__(self, status: int, message: str, limit: str | None = None):
        super().__init__(message)
        self.status, self.limit = status, limit


@dataclass(frozen=True)
class SessionLimits:
    """A run's limits, as `operators.workflows.multi_turn.Limits` says; `seed` and `run_key` make each
    call's seed when the agent sets none, so a rerun samples the same."""

    max_turns: int
    budget: int
    call_timeout: float
    seed: int | None = None
    run_key: tuple = ()


@dataclass
class SessionCall:
    """One call as the engine sampled it (choice 0: a trajectory is one path); `route` is where it came."""

    route: str
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_version: int = 0
    finish_reason: str = ""


@dataclass
class Session:
    key: str
    limits: SessionLimits
    calls: list[SessionCall | None] = field(default_factory=list)  # None: taken (`SessionBook.take_call`)
    stopped: str | None = None  # the limit that stopped the run: `max_turns` or `length`
    stop_message: str = ""
    last_used: float = field(default_factory=time.monotonic)

    def admit(self, route: str) -> tuple[SessionCall, int | None]:
        """A record for the next call and its seed, or SessionRefused naming the limit it would pass. The
        gate stamps the record's version once the call is past the weight-swap pause."""
        self.last_used = time.monotonic()
        done = next((c for c in reversed(self.calls) if c is not None), None)
        if self.stopped is None and len(self.calls) >= self.limits.max_turns:
            self.stop("max_turns", f"max_turns={self.limits.max_turns} calls made")
        elif self.stopped is None and done and len(done.prompt_ids) + len(done.response_ids) >= self.budget:
            self.stop("length", f"the trajectory holds max_trajectory_tokens={self.budget}")
        if self.stopped is not None:
            raise SessionRefused(400, f"this run may make no more calls: {self.stop_message}", self.stopped)
        call = self.add_call(route)
        return call, derive_seed(self.limits.seed, *self.limits.run_key, len(self.calls) - 1)

    def add_call(self, route: str, model_version: int = 0) -> SessionCall:
        """A record for one engine request; an HTTP call that makes several (a completions request with a
        list of prompts) gets one each, counted against max_turns as one."""
        call = SessionCall(route, model_version=model_version)
        self.calls.append(call)
        return call

    @property
    def budget(self) -> int:
        return self.limits.budget

    def room(self, prompt_len: int) -> int:
        """How many tokens a call with this prompt may still sample within the trajectory budget."""
        return self.budget - prompt_len

    def stop(self, reason: str, message: str) -> None:
        self.stopped, self.stop_message = reason, message


class SessionBook:
    """The open sessions of one engine, by key."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}

    def open(self, limits: SessionLimits) -> str:
        self.sweep()
        key = KEY_PREFIX + secrets.token_urlsafe(24)
        self.sessions[key] = Session(key, limits)
        return key

    def get(self, key: str | None) -> Session:
        """The open session of `key`, or SessionRefused (401): no key, an unknown one or a finished one."""
        session = self.sessions.get(key or "")
        if session is None:
            raise SessionRefused(401, "no open session has this API key: use the key of the run's session")
        return session

    def collect(self, key: str) -> dict[str, Any]:
        """The session's calls in order and why it stopped, once: the session ends here."""
        session = self.sessions.pop(key, None)
        if session is None:
            gone = f"it was collected, or dropped after {IDLE_S:g}s idle"
            raise KeyError(f"no open session {key[:8]}...: {gone}")
        # a call vLLM refused sampled nothing; a taken one was handed over already
        calls = [asdict(c) for c in session.calls if c is not None and c.prompt_ids]
        return {"calls": calls, "stopped": session.stopped, "stop_message": session.stop_message}

    def take_call(self, key: str, index: int) -> dict[str, Any]:
        """One finished call's record, handed over once (a serving front stores it as each call ends); the
        session stays open, and the record's memory is freed."""
        session = self.get(key)
        call = session.calls[index]
        if call is None:
            raise KeyError(f"call {index} of session {key[:8]}... was already taken")
        session.calls[index] = None
        return asdict(call)

    def close(self, key: str) -> None:
        """End a session without collecting it (its run failed)."""
        self.sessions.pop(key, None)

    def sweep(self) -> None:
        """Drop sessions idle past IDLE_S: their runs died without collecting them."""
        now = time.monotonic()
        for key in [k for k, s in self.sessions.items() if now - s.last_used > IDLE_S]:
            del self.sessions[key]

    def __len__(self) -> int:
        return len(self.sessions)
