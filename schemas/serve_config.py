"""`serve`: serve mode's front (`python -m pipelines.serve`, or `mode: serve`), its limits and its commits.

The front puts one OpenAI-compatible endpoint in front of the engines, records every call it serves, takes
rewards as feedback, and commits what was rewarded as steps for a trainer (docs/serving.md).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from schemas.config_base import Strict
from schemas.engine_config import LOCAL_HOSTS


class ServeConfig(Strict):
    free_on_resume: ClassVar[frozenset[str]] = frozenset(
        {
            "host",
            "port",
            "admin_key",
            "max_concurrent",
            "max_request_bytes",
            "idle_session_s",
            "commit_every_sessions",
            "commit_every_s",
            "health_check_interval_s",
            "min_running_engines",
        }
    )

    host: str = Field(
        "127.0.0.1", min_length=1, description="address the front listens on; any other needs `admin_key`"
    )
    port: int = Field(8010, ge=0, le=65535, description="port of the front (0: a free one, printed)")
    admin_key: str | None = Field(
        None,
        min_length=1,
        description="the key that opens sessions, commits and reads metrics when the front listens beyond "
        "this machine; sessionless calls then need it too",
    )
    max_concurrent: int = Field(
        64, ge=1, description="model calls served at once; one more is answered 429, never queued"
    )
    max_request_bytes: int = Field(
        8 * 2**20, ge=1024, description="the largest request body; a larger one is answered 413"
    )
    idle_session_s: float = Field(
        600.0, gt=0, description="a session with no call for this long ends by itself"
    )
    commit_every_sessions: int | None = Field(
        None, ge=1, description="commit a step once this many sessions are rewarded and ended"
    )
    commit_every_s: float | None = Field(
        None, gt=0, description="commit a step every this many seconds when something is ready"
    )
    unrewarded: Literal["drop", "zero"] = Field(
        "drop",
        description="calls of an ended session that got no reward: dropped, or written with reward 0; "
        "counted either way (`serve/unrewarded`)",
    )
    trajectory: Literal["per_call", "merge"] = Field(
        "per_call",
        description="`per_call`: one experience per call, with its own reward; `merge`: a session's calls "
        "as one trajectory where each extends the last, with its last reward",
    )
    db_url: str | None = Field(
        None,
        min_length=1,
        description="SQL database of served calls and rewards (default: sqlite serve.db in the run dir)",
    )
    min_running_engines: int = Field(
        1, ge=1, description="engines that keep serving while the others load a new version"
    )
    health_check_interval_s: float = Field(
        5.0, gt=0, description="how often engines are checked and a newer version is rolled out"
    )
    call_timeout: float = Field(300.0, gt=0, description="the most one model call may take, in seconds")

    @model_validator(mode="after")
    def _key_off_this_machine(self) -> ServeConfig:
        # Anyone who can reach the port could open sessions, reward calls and commit steps.
        if self.host not in LOCAL_HOSTS and self.admin_key is None:
            raise ValueError(
                f"serve.host {self.host!r} (Trinity-RFT: explorer.listen_address, whose default is 0.0.0.0) "
                "listens beyond this machine: set serve.admin_key too (--set serve.admin_key=KEY), or listen "
                "on 127.0.0.1 (serve.host, or explorer.listen_address in a Trinity-RFT config)"
            )
        return self
