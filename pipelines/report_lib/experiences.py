"""A run's experiences as pyarrow tables: its committed steps (Parquet or SQL), its evals, and the SQL
sink's commit log, each found inside the run dir.

The committed steps are read through the sinks' own readers (`operators.sinks`), so the report sees exactly
what a trainer sees: committed steps only, in order, older run dirs conformed to today's schema. The SQL
store is the run dir's `experiences.db`, not the URL recorded in config.yaml, and its table is found in the
file, since the default table name comes from the run dir's name, which a copy may change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from operators.sinks.base import default_table_name
from operators.sinks.parquet import ParquetSink
from operators.sinks.reader import ExperienceReader
from operators.sinks.sql import SqlSink
from pipelines.report_lib.runs import config_field, experiences_db_url, run_config
from schemas.errors import InputError
from schemas.experience import EXPERIENCE_SCHEMA, conform
from schemas.run_dir import EVAL, EXPERIENCES, EXPERIENCES_DB, STEP_GLOB, STEP_PREFIX

log = logging.getLogger(__name__)

BUFFER = "buffer.trainer_input.experience_buffer"
STEPS_SUFFIX = "_steps"  # the SQL sink's commit log is `<table>_steps`


def storage_type(run_dir: Path | str) -> str:
    """`parquet` or `sql`: as config.yaml says, else by what the run dir holds."""
    root = Path(run_dir)
    configured = config_field(run_config(root), f"{BUFFER}.storage_type")
    if configured in ("parquet", "sql"):
        return configured
    return "sql" if (root / EXPERIENCES_DB).is_file() and not (root / EXPERIENCES).is_dir() else "parquet"


def open_committed(run_dir: Path | str) -> ExperienceReader:
    """The reader a trainer would use on this run dir (Parquet or SQL); close its sink when done."""
    root = Path(run_dir).resolve()
    if storage_type(root) == "sql":
        return ExperienceReader(open_sql_sink(root))
    return ExperienceReader(ParquetSink(root / EXPERIENCES))


def read_experiences(run_dir: Path | str) -> pa.Table:
    """Every committed experience of the run, step by step (EXPERIENCE_SCHEMA; empty when none)."""
    reader = open_committed(run_dir)
    try:
        tables = [table for _, table in reader.steps()]
    finally:
        reader.sink.close()
    return pa.concat_tables(tables) if tables else EXPERIENCE_SCHEMA.empty_table()


def read_eval(run_dir: Path | str) -> pa.Table:
    """The eval experiences kept under `eval/step_NNNNNN/<taskset>.parquet`, every step and taskset."""
    files = sorted((Path(run_dir) / EVAL).glob(f"{STEP_GLOB}/*.parquet"))
    if not files:
        return EXPERIENCE_SCHEMA.empty_table()
    return pa.concat_tables(conform(pq.read_table(path)) for path in files)


def eval_steps(run_dir: Path | str) -> list[int]:
    """The steps whose eval experiences the run dir holds."""
    folders = (Path(run_dir) / EVAL).glob(STEP_GLOB)
    return sorted(int(p.name.removeprefix(STEP_PREFIX)) for p in folders if p.is_dir())


# -- the SQL sink ----------------------------------------------------------------------------------------


@contextmanager
def store_engine(url: str) -> Iterator[sa.Engine]:
    """An engine that is disposed of afterwards, so a SQLite file is not left open."""
    engine = sa.create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def sql_store_url(run_dir: Path | str) -> str:
    """The run dir's `experiences.db`; a store elsewhere only when config.yaml names one and the run dir
    has no file of its own (a PostgreSQL run, or a SQLite file the user placed)."""
    root = Path(run_dir)
    if (root / EXPERIENCES_DB).is_file():
        return experiences_db_url(root)
    configured = config_field(run_config(root), f"{BUFFER}.path")
    if configured:
        log.info("%s has no %s; reading the store config.yaml names", root, EXPERIENCES_DB)
        return str(configured)
    raise InputError(f"no {EXPERIENCES_DB}: this run did not write to SQL", file=str(root / EXPERIENCES_DB))


def sql_tables(url: str) -> list[str]:
    """The experience tables in a SQL store: every `<name>` beside its `<name>_steps` commit log."""
    with store_engine(url) as engine:
        names = set(sa.inspect(engine).get_table_names())
    return sorted(name for name in names if f"{name}{STEPS_SUFFIX}" in names)


def sql_table_name(run_dir: Path | str, url: str) -> str:
    """The run's table: the one config.yaml names, else the only one in the store, else the default name
    for the run dir's name. An InputError names the choices when none of these settles it."""
    root = Path(run_dir).resolve()
    found = sql_tables(url)
    configured = config_field(run_config(root), f"{BUFFER}.name")
    for candidate in (configured, found[0] if len(found) == 1 else None, default_table_name(root.name)):
        if candidate and candidate in found:
            return candidate
    raise InputError(
        f"no experience table of this run in {url} (tables found: {', '.join(found) or 'none'})",
        file=str(root),
    )


def open_sql_sink(run_dir: Path | str) -> SqlSink:
    """The SQL sink of the run, reading its own table in its own store; close it when done."""
    root = Path(run_dir).resolve()
    url = sql_store_url(root)
    return SqlSink(root / EXPERIENCES, url, sql_table_name(root, url))


def sql_commit_log(run_dir: Path | str) -> pa.Table:
    """The SQL sink's commit log (`<table>_steps`): step, num_experiences, committed_at, by step. It is what
    a trainer polls: a step is there once its one transaction committed, all of its rows with it."""
    sink = open_sql_sink(run_dir)
    try:
        with sink.engine.connect() as conn:
            rows = conn.execute(sa.select(sink.steps).order_by(sink.steps.c.step)).mappings().all()
    finally:
        sink.close()
    schema = pa.schema(
        [("step", pa.int64()), ("num_experiences", pa.int64()), ("committed_at", pa.timestamp("us"))]
    )
    columns = {name: [row[name] for row in rows] for name in schema.names}
    for index, value in enumerate(columns["committed_at"]):
        if value is not None and value.tzinfo is not None:  # SQLite gives naive UTC, PostgreSQL aware
            columns["committed_at"][index] = value.astimezone(UTC).replace(tzinfo=None)
    return pa.table(columns, schema=schema)
