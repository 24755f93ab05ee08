"""What a run directory is, read from the files in it, and where its stores are, relative to the directory.

A run dir may be copied or moved after the run: its config.yaml, MLflow params and MLflow artifact URIs
name absolute paths of where it was written. Everything here locates a store by the run dir's own layout
(`schemas.run_dir`), never by a recorded absolute path, so a copied run dir still opens.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tokenizers import Tokenizer

from schemas.errors import InputError
from schemas.run_dir import (
    BENCH_RESULTS_CSV,
    BENCH_STATE,
    CONFIG,
    EXPERIENCES,
    EXPLORER_STATE,
    MLARTIFACTS,
    MLFLOW_DB,
    RunDir,
)

log = logging.getLogger(__name__)

CHECKOUT = Path(__file__).resolve().parents[2]  # the repository's root: pipelines/report_lib/runs.py
EXPLORE = "explore"
BENCH = "bench"
RUN_ID_FIELDS = {EXPLORE: (EXPLORER_STATE, "mlflow_run_id"), BENCH: (BENCH_STATE, "parent_run_id")}


@dataclass(frozen=True)
class Run:
    """One run directory as the report sees it: where it is, what kind of run wrote it, its MLflow run."""

    root: Path
    kind: str  # EXPLORE or BENCH
    run_id: str | None  # the explorer's MLflow run, or the bench's parent run; None when not recorded

    @property
    def tracking_uri(self) -> str:
        return tracking_uri(self.root)

    @property
    def has_mlflow(self) -> bool:
        """Whether the run dir holds its MLflow store (a run given `--mlflow-uri` elsewhere does not)."""
        return (self.root / MLFLOW_DB).is_file()

    @property
    def artifacts(self) -> Path | None:
        """The run's MLflow artifact folder by the run dir's layout (None without a run id)."""
        return None if self.run_id is None else artifact_dir(self.root, self.run_id)


def run_kind(root: Path) -> str | None:
    """EXPLORE or BENCH by the files present (a bench writes its table; an explorer its config and steps)."""
    if (root / BENCH_RESULTS_CSV).is_file():
        return BENCH
    if (root / CONFIG).is_file() or (root / EXPERIENCES).is_dir() or (root / EXPLORER_STATE).is_file():
        return EXPLORE
    return None


def locate(run_dir: Path | str) -> Path:
    """`run_dir` as given; or, when it is relative and not there from the working directory, the same path
    under the checkout's root. A notebook opened in Jupyter runs in `notebooks/`, and a run dir given as the
    run printed it (`runs/...`, relative to the root, where the run was started) is found all the same."""
    root = Path(run_dir)
    if not root.exists() and not root.is_absolute() and (CHECKOUT / root).exists():
        return CHECKOUT / root
    return root


def open_run(run_dir: Path | str) -> Run:
    """The run in `run_dir` (see `locate`), or an InputError naming the path when it is missing or not a run
    dir."""
    root = locate(run_dir)
    if not root.exists():
        raise InputError("no such run directory", file=str(root))
    if not root.is_dir():
        raise InputError("not a directory: give a run directory", file=str(root))
    kind = run_kind(root)
    if kind is None:
        raise InputError(
            f"not a run directory (no {BENCH_RESULTS_CSV}, {CONFIG} or {EXPERIENCES}/ in it)", file=str(root)
        )
    state_file, field = RUN_ID_FIELDS[kind]
    return Run(root.resolve(), kind, state_value(root / state_file, field))


def state_value(path: Path, field: str) -> Any:
    """One field of a JSON state file; None (with a warning) when the file is absent or unreadable, since a
    report can still be drawn without it."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8")).get(field)
    except (OSError, ValueError, AttributeError) as exc:
        log.warning("%s cannot be read (%s); going on without its %s", path, exc, field)
        return None


def tracking_uri(run_dir: Path | str) -> str:
    """The run's own MLflow store, whatever URI was recorded when it ran (that one may name another place)."""
    return RunDir(run_dir).mlflow_uri


def experiences_db_url(run_dir: Path | str) -> str:
    """The SQL sink's default SQLite file of the run, found in the run dir."""
    return RunDir(run_dir).experiences_db_url


def artifact_dir(run_dir: Path | str, run_id: str) -> Path:
    """`mlartifacts/<run id>/artifacts`: where the project's MLflow experiments keep a run's artifacts (the
    experiment's location is the run dir's `mlartifacts/`, and MLflow adds `<run id>/artifacts`)."""
    return Path(run_dir).resolve() / MLARTIFACTS / run_id / "artifacts"


def run_config(run_dir: Path | str) -> dict[str, Any]:
    """config.yaml as plain data ({} when absent). Not validated: the report must open a run whose model
    or tasksets are gone, and reads only a few fields."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return {}
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def config_field(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """`config["a"]["b"]` for "a.b", or `default` where the path is missing."""
    value: Any = config
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return default
        value = value[key]
    return value


def token_decoder(run_dir: Path | str) -> Callable[[list[int]], str] | None:
    """Token ids to text with the run's tokenizer (its model's `tokenizer.json`), so the rollout browser can
    show inserted spans as text; None when the model is not on this machine (ids are shown then)."""
    model = config_field(run_config(run_dir), "model.model_path")
    path = Path(str(model)) / "tokenizer.json" if model else None
    if path is None or not path.is_file():
        return None
    tokenizer = Tokenizer.from_file(str(path))
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def bench_rows(run_dir: Path | str) -> list[dict[str, Any]]:
    """`bench_results.csv` as rows with numbers parsed: an estimate and its `_ci_low`/`_ci_high` as floats,
    the step an int; cells left empty (a failed checkpoint's) are dropped from the row."""
    path = Path(run_dir) / BENCH_RESULTS_CSV
    if not path.is_file():
        raise InputError(f"no {BENCH_RESULTS_CSV}: not a bench run dir", file=str(path))
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    return [parse_bench_row(row) for row in rows]


def parse_bench_row(row: dict[str, str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for name, text in row.items():
        if text in ("", None):
            continue
        if name in ("checkpoint", "weights_hash", "taskset", "status", "reason"):
            parsed[name] = text
        elif name in ("step", "k"):
            parsed[name] = int(float(text))
        else:
            parsed[name] = float(text)
    parsed.setdefault("status", "ok")
    return parsed
