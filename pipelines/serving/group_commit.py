"""Group commit: the store's writes, from any number of concurrent callers, run by one writer thread in as
few transactions as the disk allows.

A commit costs a lock, a WAL write and, with a database that syncs each commit, a disk sync (milliseconds,
tens of them on a busy disk). One transaction per served call would queue every concurrent session behind
the last; here the writer takes every write waiting when it is free, runs them in one transaction and commits
once, so each caller still returns only once its own write is committed, but N callers share one commit.

A write that raises (a reward for an unknown call) raises to its own caller only: each write checks before it
changes anything, and SQLite undoes a failed statement alone, so the others in the transaction stand.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import sqlalchemy as sa

Write = Callable[[sa.Connection], Any]
STOP = None


class GroupCommit:
    def __init__(self, engine: sa.Engine):
        self.engine = engine
        self.pending: queue.Queue[tuple[Write, Future] | None] = queue.Queue()
        self.thread = threading.Thread(target=self.loop, name="rftflow-serve-store", daemon=True)
        self.thread.start()

    def submit(self, write: Write) -> Future:
        """Queue `write`; its future resolves once the transaction holding it is committed."""
        future: Future = Future()
        self.pending.put((write, future))
        return future

    def run(self, write: Write) -> Any:
        """`write`'s result, once durable (its exception, if it raised)."""
        return self.submit(write).result()

    def close(self) -> None:
        self.pending.put(STOP)
        self.thread.join(timeout=30)

    def loop(self) -> None:
        while True:
            first = self.pending.get()
            if first is STOP:
                return
            batch = [first]
            while True:
                try:
                    item = self.pending.get_nowait()
                except queue.Empty:
                    break
                if item is STOP:
                    self.pending.put(STOP)
                    break
                batch.append(item)
            self.commit(batch)

    def commit(self, batch: list[tuple[Write, Future]]) -> None:
        results: list[tuple[Future, Any, BaseException | None]] = []
        try:
            with self.engine.begin() as db:
                for write, future in batch:
                    try:
                        results.append((future, write(db), None))
                    except Exception as exc:  # noqa: BLE001 - this caller's failure, not the batch's
                        results.append((future, None, exc))
        except Exception as exc:  # noqa: BLE001 - the commit itself failed: every caller hears it
            for _, future in batch:
                future.set_exception(exc)
            return
        for future, result, error in results:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)
