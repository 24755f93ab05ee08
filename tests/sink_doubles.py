"""Test doubles of the SQL sink for faults a real database cannot be made to show on demand."""

from __future__ import annotations

import sqlalchemy as sa

from operators.sinks.sql import SqlSink


class HalfInsertDouble(SqlSink):
    """Test double: the insert writes half of the step's rows, then the process 'dies' (an exception)."""

    def _insert(self, conn, step, rows):
        conn.execute(sa.insert(self.experiences), rows[: len(rows) // 2])
        raise RuntimeError("double: died halfway through the insert")


class CrashBeforeCleanupDouble(SqlSink):
    """Test double: the transaction commits, then the process 'dies' before removing the pending folder."""

    def _remove_pending(self, pending):
        raise RuntimeError("double: died after the commit")
