"""Input errors that point at the exact place to fix: file, row (1-based line) and field."""

from __future__ import annotations


class InputError(ValueError):
    """A taskset or config problem, located precisely so the user can fix it without a traceback hunt."""

    def __init__(
        self, message: str, *, file: str | None = None, row: int | None = None, field: str | None = None
    ):
        self.file, self.row, self.field, self.reason = file, row, field, message
        where = []
        if file is not None:
            where.append(str(file) if row is None else f"{file}:{row}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class TaskInputError(ValueError):
    """A task whose input cannot run as it is (a prompt over the token limit): it fails at once, unretried."""
