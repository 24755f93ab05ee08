"""SQL experience sink (SQLAlchemy Core): SQLite by default, PostgreSQL through `postgresql+psycopg://`.

Two tables per run: `<name>` holds one row per experience, keyed `(task_uid, run_id, segment)`, and
`<name>_steps` is the commit log, one row per committed step. A step commits in ONE transaction that
inserts its experiences and its log row, so a reader sees all of a step or none of it, and the keys make
a second copy of an experience impossible. The log is the truth: a crash after the transaction but before the
pending fragments are removed leaves a committed step and some harmless files.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from operators.sinks.parquet import filter_stale, pending_fragments, read_fragments
from schemas.errors import InputError
from schemas.experience import ADDED_COLUMNS, EXPERIENCE_SCHEMA, KEY, conform, is_single_turn
from schemas.run_dir import PENDING
from schemas.secrets import mask_text
from schemas.storage import Location, as_location, delete_tree, is_remote, join

FIELD = "buffer.trainer_input.experience_buffer"
SQLITE_BUSY_S = 60.0  # a trainer reading the same SQLite file holds its lock only briefly
# Lists and maps are stored as JSON text: portable to every SQL store, and exact for float32 values.
JSON_COLUMNS = [f.name for f in EXPERIENCE_SCHEMA if pa.types.is_list(f.type) or pa.types.is_map(f.type)]
MAP_COLUMNS = [f.name for f in EXPERIENCE_SCHEMA if pa.types.is_map(f.type)]
POSITION = "position"  # a row's place in its step, so a step reads back in the order it was committed


def sql_type(arrow: pa.DataType) -> sa.types.TypeEngine:
    if pa.types.is_string(arrow) or pa.types.is_list(arrow) or pa.types.is_map(arrow):
        return sa.Text()
    if pa.types.is_int32(arrow):
        return sa.Integer()
    if pa.types.is_int64(arrow):
        return sa.BigInteger()
    if pa.types.is_floating(arrow):
        return sa.Double()  # a float32 goes through a float64 exactly
    if pa.types.is_boolean(arrow):
        return sa.Boolean()
    raise TypeError(f"no SQL column type for {arrow}")


def store_url(text: str) -> sa.URL:
    """`text` as a SQLAlchemy URL; a SQLite file path made absolute, an in-memory SQLite refused."""
    try:
        url = sa.make_url(text)
    except sa.exc.ArgumentError:
        raise InputError(
            f"not a SQLAlchemy URL: {mask_text(text)} (e.g. sqlite:////abs/experiences.db or "
            "postgresql+psycopg://user:password@host/db)",
            field=f"{FIELD}.path",
        ) from None
    if url.get_backend_name() == "sqlite":
        if url.database in (None, "", ":memory:"):
            raise InputError(
                f"{mask_text(text)}: an in-memory SQLite database loses the experiences at exit; name a file",
                field=f"{FIELD}.path",
            )
        url = url.set(database=str(Path(url.database).expanduser().resolve()))
    return url


def first_line(exc: sa.exc.DBAPIError) -> str:
    return str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig).__name__


class SqlSink:
    """Driver side of the SQL sink; also what readers use (they never create tables)."""

    def __init__(self, root: Location, url: str, name: str):
        self.root = as_location(root)
        self.url = store_url(url)
        self.name = name
        self.metadata = sa.MetaData()
        columns = [
            sa.Column(f.name, sql_type(f.type), nullable=f.name not in (*KEY, "step"))
            for f in EXPERIENCE_SCHEMA
        ]
        self.experiences = sa.Table(
            name,
            self.metadata,
            *columns,
            sa.Column(POSITION, sa.Integer(), nullable=False),
            sa.PrimaryKeyConstraint(*KEY, name=f"pk_{name}"),
            sa.Index(f"ix_{name}_step", "step"),
        )
        self.steps = sa.Table(
            f"{name}_steps",
            self.metadata,
            sa.Column("step", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("num_experiences", sa.Integer(), nullable=False),
            sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False),
        )
        self.engine = self._create_engine()
        self.checked = False  # the tables exist and are rftflow's
        self.missing: set[str] = set()  # ADDED_COLUMNS an older table lacks (read as their old meaning)

    def close(self) -> None:
        """Close the pooled connections (a SQLite file would stay open otherwise); a later call reconnects."""
        self.engine.dispose()

    def describe(self) -> str:
        return f"{self.masked_url}, table {self.name} (SQL, commit log {self.steps.name})"

    @property
    def masked_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    def committed_steps(self) -> list[int]:
        with self._connection() as conn:
            if not self._check(conn, create=False):
                return []
            return list(conn.scalars(sa.select(self.steps.c.step).order_by(self.steps.c.step)))

    def commit_step(self, step: int, fragments: set[str], min_version: int | None = None) -> int:
        """Insert the named fragments of `step` and its log row in one transaction; returns the stale dropped.

        Fragments no record names are ignored (and removed with the pending folder); experiences from a
        model version below `min_version` are dropped before the insert.
        """
        if step in self.committed_steps():
            raise RuntimeError(f"step {step} is already committed in {self.describe()}")
        pending = pending_fragments(self.root, step, fragments)
        paths = [join(pending, n) for n in sorted(fragments)]
        table, dropped = filter_stale(read_fragments(paths), min_version)
        try:
            with self._connection(begin=True) as conn:
                self._check(conn, create=True)
                self._insert(conn, step, encode_rows(table, self.missing))
        except sa.exc.IntegrityError as exc:
            raise RuntimeError(
                f"step {step} not committed: {self.describe()} already holds the step or one of its "
                f"({', '.join(KEY)}) keys ({first_line(exc)}); another run writing the same table?"
            ) from None
        self._remove_pending(pending)
        return dropped

    def read_step(self, step: int) -> pa.Table:
        with self._connection() as conn:
            if not self._check(conn, create=False):
                return EXPERIENCE_SCHEMA.empty_table()
            names = [n for n in EXPERIENCE_SCHEMA.names if n not in self.missing]
            query = (
                sa.select(*(self.experiences.c[n] for n in names))
                .where(self.experiences.c.step == step)
                .order_by(self.experiences.c[POSITION])
            )
            rows = conn.execute(query).all()
        return decode_rows(rows, names)

    def discard_pending(self) -> None:
        delete_tree(join(self.root, PENDING))
        if not is_remote(self.root):
            with contextlib.suppress(OSError):  # the staging root holds nothing else for SQL
                self.root.rmdir()

    # -- internals ---------------------------------------------------------------------------------------

    def _insert(self, conn: sa.Connection, step: int, rows: list[dict[str, Any]]) -> None:
        if rows:
            conn.execute(sa.insert(self.experiences), rows)
        log = {"step": step, "num_experiences": len(rows), "committed_at": datetime.now(UTC)}
        conn.execute(sa.insert(self.steps), log)

    def _remove_pending(self, pending: Location) -> None:
        delete_tree(pending)

    def _create_engine(self) -> sa.Engine:
        sqlite = self.url.get_backend_name() == "sqlite"
        options: dict[str, Any] = (
            {"connect_args": {"timeout": SQLITE_BUSY_S}} if sqlite else {"pool_pre_ping": True}
        )
        try:
            return sa.create_engine(self.url, **options)
        except (sa.exc.NoSuchModuleError, ImportError) as exc:
            raise InputError(
                f"{self.masked_url}: no database driver for '{self.url.drivername}' ({exc}); for PostgreSQL "
                "use postgresql+psycopg://... after pip install -e '.[postgres]'",
                field=f"{FIELD}.path",
            ) from None

    @contextlib.contextmanager
    def _connection(self, begin: bool = False) -> Iterator[sa.Connection]:
        """A connection (in a transaction when `begin`); an unreachable store gets a one-line error."""
        if self.url.get_backend_name() == "sqlite":
            Path(self.url.database).parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.engine.begin() if begin else self.engine.connect() as conn:
                yield conn
        except sa.exc.OperationalError as exc:
            message = f"cannot use {self.masked_url}: {first_line(exc)}; check the URL and the server"
            if self.checked:  # it worked before: a failure during the run, not a bad setting
                raise RuntimeError(message) from None
            raise InputError(message, field=f"{FIELD}.path") from None

    def _check(self, conn: sa.Connection, create: bool) -> bool:
        """True once both tables exist (created when `create`) with rftflow's columns."""
        if self.checked:
            return True
        if create:
            self.metadata.create_all(conn)
        inspector = sa.inspect(conn)
        present = [t for t in (self.experiences, self.steps) if inspector.has_table(t.name)]
        for table in present:
            expected = set(table.c.keys())
            found = {c["name"] for c in inspector.get_columns(table.name)}
            if table is self.experiences and (expected - found) <= set(ADDED_COLUMNS):
                self.missing = expected - found  # a table written before these columns existed
                found |= self.missing
            if found != expected:
                raise InputError(
                    f"table {table.name} in {self.masked_url} is not an rftflow experience table (columns "
                    f"missing: {sorted(expected - found)}, unknown: {sorted(found - expected)}); "
                    "choose another name",
                    field=f"{FIELD}.name",
                )
        if len(present) < 2:
            return False
        self.checked = True
        return True


def encode_rows(table: pa.Table, missing: set[str]) -> list[dict[str, Any]]:
    """Experience rows as SQL parameters: lists and maps as JSON text, each with its place in the step.
    `missing`: columns an older table lacks, left out (a row there must hold what they meant then)."""
    if missing and not is_single_turn(table):
        raise RuntimeError(
            f"the SQL table predates columns {sorted(missing)}, which these multi-turn experiences need: "
            "write this run to a new table name"
        )
    rows = table.select([n for n in EXPERIENCE_SCHEMA.names if n not in missing]).to_pylist()
    for position, row in enumerate(rows):
        for name in JSON_COLUMNS:
            if row[name] is not None:
                row[name] = json.dumps(row[name])
        row[POSITION] = position
    return rows


def decode_rows(rows: list[sa.Row], names: list[str]) -> pa.Table:
    """The inverse of `encode_rows` (of the columns `names`): exactly the table that was committed."""
    columns = list(zip(*rows, strict=True)) or [()] * len(names)
    data = {}
    for name, column in zip(names, columns, strict=True):
        values = list(column)
        if name in JSON_COLUMNS:
            values = [None if v is None else json.loads(v) for v in values]
        if name in MAP_COLUMNS:
            values = [None if v is None else [tuple(pair) for pair in v] for v in values]
        data[name] = values
    schema = pa.schema([EXPERIENCE_SCHEMA.field(n) for n in names])
    return conform(pa.Table.from_pydict(data, schema=schema))
