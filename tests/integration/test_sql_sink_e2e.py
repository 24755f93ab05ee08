"""Explore runs on the real stack into SQL (SQLite and a real PostgreSQL) and through the experience queue."""

from __future__ import annotations

import threading
import uuid

import pytest
import sqlalchemy as sa
from integration_settings import BASE
from services import postgres_url

from operators.engine.proc_stats import open_files_under
from operators.sinks.queue import QueueReader
from operators.sinks.reader import open_reader
from pipelines.control.state import ExplorerState
from pipelines.explore import explore
from schemas.config import load_config

BUFFER = "buffer.trainer_input.experience_buffer"
BATCH, REPEATS = 4, 2  # as in BASE


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_store(request) -> list[str]:
    """Overrides for an SQL store; a PostgreSQL run gets tables of its own, dropped afterwards."""
    if request.param == "sqlite":
        yield [f"{BUFFER}.storage_type=sql"]
        return
    url = postgres_url()
    name = f"e2e_{uuid.uuid4().hex[:12]}"
    yield [f"{BUFFER}.storage_type=sql", f"{BUFFER}.path={url}", f"{BUFFER}.name={name}"]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in (f"{name}_steps", name):
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{table}"'))
    engine.dispose()


def test_an_sql_run_holds_every_experience_once_and_its_reader_yields_them(engines, tmp_path, sql_store):
    steps = 2
    cfg = load_config(None, [*BASE, f"buffer.total_steps={steps}", *sql_store])
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines)
    assert open_files_under(summary.run_dir) == []  # the run's SQLite file was closed with the run
    reader = open_reader(summary.run_dir)  # the store as the run's config.yaml names it
    assert summary.store == reader.sink.describe()
    with reader.sink.engine.connect() as conn:
        table = reader.sink.experiences
        keys = conn.execute(sa.select(table.c.task_uid, table.c.run_id)).all()
        logged = conn.execute(sa.select(reader.sink.steps.c.step, reader.sink.steps.c.num_experiences)).all()
    assert len(keys) == len(set(keys)) == steps * BATCH * REPEATS == summary.experiences
    assert sorted(logged) == [(1, BATCH * REPEATS), (2, BATCH * REPEATS)]
    read = [(step, t.num_rows, set(t.column("step").to_pylist())) for step, t in reader.steps()]
    assert read == [(1, BATCH * REPEATS, {1}), (2, BATCH * REPEATS, {2})]
    assert not (summary.run_dir / "experiences").exists()  # no step folders, no pending fragments


def test_a_queue_fed_run_hands_every_committed_step_to_its_reader(engines, tmp_path):
    """Resumed with a queue, a run first hands over the steps it committed before it had one."""
    run_dir = tmp_path / "run"
    explore(load_config(None, [*BASE, "buffer.total_steps=2"]), run_dir, progress=False, engines=engines)
    steps = 4
    cfg = load_config(None, [*BASE, f"buffer.total_steps={steps}", f"{BUFFER}.queue_capacity=1"])
    received: list = []
    reader = QueueReader(run_dir.name, poll_s=0.1, idle_timeout=300)  # waits for the queue to appear
    thread = threading.Thread(target=lambda: received.extend(reader))
    thread.start()
    summary = explore(cfg, run_dir, progress=False, engines=engines)
    thread.join(timeout=60)
    assert not thread.is_alive()  # the end-of-stream marker ended it
    store = open_reader(run_dir)
    assert [step for step, _ in received] == [1, 2, 3, 4] == store.committed_steps()
    assert all(table.equals(store.read_step(step)) for step, table in received)
    assert summary.experiences == (steps - 2) * BATCH * REPEATS  # this run explored steps 3 and 4 only
    assert ExplorerState.load(run_dir).published_step == steps


def test_the_reference_trainer_in_the_cluster_trains_on_every_step_from_the_queue(engines, tmp_path):
    """`--with-trainer`: the trainer actor reads the queue (not the store), one version per step."""
    steps = 3
    overrides = [
        f"buffer.total_steps={steps}",
        "synchronizer.sync_method=checkpoint",
        "synchronizer.sync_timeout=120",
        f"{BUFFER}.storage_type=sql",
        f"{BUFFER}.queue_capacity=1",
        f"{BUFFER}.queue_timeout=60",  # unread, the queue would fail step 2 after this
    ]
    cfg = load_config(None, [*BASE, *overrides])
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines, with_trainer=True)
    checkpoints = sorted(p.name for p in (summary.run_dir / "checkpoints").glob("global_step_*"))
    assert checkpoints == [f"global_step_{v}" for v in range(1, steps + 1)]
    assert summary.model_version >= steps - 1  # the last version may come after the last sync
