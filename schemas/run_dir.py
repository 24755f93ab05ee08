"""Every path the project writes inside a run directory and a checkpoint directory, named once.

A run directory (`--run-dir`, docs/outputs.md and docs/running.md, "Benchmarking checkpoints"), local or on an
object store (`schemas.storage`; there the experiences, the eval experiences, the state and the config only):

    experiences/step_NNNNNN/part-*.parquet  committed steps (Parquet; `_COMMITTED` on object stores)
    experiences/_pending/                   fragments of steps not yet committed (every sink)
    experiences.db                          SQL sink, default SQLite file
    mlflow.db                               the MLflow tracking store (SQLite)
    mlartifacts/                            MLflow artifacts: `samples/step_NNNNNN.json`, `failures/...`
    config.yaml                             the resolved config
    explorer_state.json                     where the explorer stands
    finished.json                           the run committed its last step (`schemas.run_end`)
    checkpoints/                            the default checkpoint dir
    eval/step_NNNNNN/<taskset>.parquet      eval experiences
    bench_state.json, bench_results.csv, bench_results.md, bench_plot.png    the bench's results
    bench/step_N-<hash>/<taskset>.parquet   the bench's eval experiences

A checkpoint directory: `global_step_N/` per version (written aside as `.global_step_N.partial/`) and
`trainer_status.json`. A model directory the project builds also holds `BUILD_INFO.json`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from schemas.storage import Location, as_location, join

# run directory
EXPERIENCES = "experiences"  # the staging root: Parquet's committed steps, and every sink's pending fragments
PENDING = "_pending"  # under EXPERIENCES; `_` so dataset readers skip it
EXPERIENCES_DB = "experiences.db"
MLFLOW_DB = "mlflow.db"
MLARTIFACTS = "mlartifacts"
CONFIG = "config.yaml"
EXPLORER_STATE = "explorer_state.json"
FINISHED = "finished.json"  # the run committed its last step; removed when it resumes with steps left
CARRIED_TASKS = "carried_tasks.json"  # tasks the last committed step moved on (over-rollout `recycle`)
CHECKPOINTS = "checkpoints"
EVAL = "eval"
BENCH = "bench"
BENCH_STATE = "bench_state.json"
BENCH_RESULTS_CSV = "bench_results.csv"
BENCH_RESULTS_MD = "bench_results.md"
BENCH_PLOT = "bench_plot.png"
# checkpoint directory
TRAINER_STATUS = "trainer_status.json"
CHECKPOINT_PREFIX = "global_step_"
CHECKPOINT_DIR = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")
# model directory
BUILD_INFO = "BUILD_INFO.json"

STEP_PREFIX = "step_"
STEP_GLOB = f"{STEP_PREFIX}*"


def step_dir_name(step: int) -> str:
    """`step_000042`: a committed, pending or eval step's folder."""
    return f"{STEP_PREFIX}{step:06d}"


def checkpoint_dir_name(version: int) -> str:
    """`global_step_N`: a checkpoint's folder (N not padded, as trainers write it)."""
    return f"{CHECKPOINT_PREFIX}{version}"


def partial_checkpoint_dir_name(version: int) -> str:
    """`.global_step_N.partial`: a checkpoint being written; never matches `CHECKPOINT_DIR`."""
    return f".{checkpoint_dir_name(version)}.partial"


def checkpoint_version(name: str) -> int | None:
    """N for a folder named `global_step_N`, else None."""
    match = CHECKPOINT_DIR.match(name)
    return int(match.group(1)) if match else None


def bench_dir_name(step: int, weights_hash: str) -> str:
    """`step_N-<first 12 hex of the weights hash>`: one checkpoint's bench experiences."""
    return f"{STEP_PREFIX}{step}-{weights_hash[:12]}"


def samples_artifact(step: int) -> str:
    """The MLflow artifact file of a step's sample rollouts."""
    return f"samples/{step_dir_name(step)}.json"


def failures_artifact(step: int) -> str:
    """The MLflow artifact file of a step's failed tasks."""
    return f"failures/{step_dir_name(step)}.json"


def trainer_status_path(checkpoint_dir: Path | str) -> Path:
    return Path(checkpoint_dir) / TRAINER_STATUS


def sqlite_url(path: Location) -> str:
    """A SQLAlchemy URL for the SQLite file at `path`, made absolute (symlinks resolved)."""
    return f"sqlite:///{Path(path).resolve()}"


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory: `RunDir(root).explorer_state`, `.eval_step(3)`, ...

    `root` is a local path or an object-store URI (`schemas.storage`); each path is of the same kind.
    """

    root: Location

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", as_location(self.root))

    @property
    def experiences(self) -> Location:
        return join(self.root, EXPERIENCES)

    @property
    def pending(self) -> Location:
        return join(self.experiences, PENDING)

    @property
    def experiences_db(self) -> Location:
        return join(self.root, EXPERIENCES_DB)

    @property
    def experiences_db_url(self) -> str:
        """The SQL sink's default store, SQLite at the absolute path of `experiences.db` (a local run dir)."""
        return sqlite_url(self.experiences_db)

    @property
    def mlflow_db(self) -> Location:
        return join(self.root, MLFLOW_DB)

    @property
    def mlflow_uri(self) -> str:
        """The default MLflow store, SQLite at the absolute path of `mlflow.db`, so that it does not depend on
        the working directory (a local run dir)."""
        return sqlite_url(self.mlflow_db)

    @property
    def mlartifacts(self) -> Location:
        return join(self.root, MLARTIFACTS)

    @property
    def config(self) -> Location:
        return join(self.root, CONFIG)

    @property
    def explorer_state(self) -> Location:
        return join(self.root, EXPLORER_STATE)

    @property
    def checkpoints(self) -> Location:
        return join(self.root, CHECKPOINTS)

    def eval_step(self, step: int) -> Location:
        return join(self.root, EVAL, step_dir_name(step))

    @property
    def bench_state(self) -> Location:
        return join(self.root, BENCH_STATE)

    def bench_checkpoint(self, step: int, weights_hash: str) -> Location:
        return join(self.root, BENCH, bench_dir_name(step, weights_hash))
