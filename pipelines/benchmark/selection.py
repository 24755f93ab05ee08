"""Which checkpoints a benchmark runs, in which order, and whether each can be loaded at all.

Every check here reads only headers and `config.json` (an adapter's: `adapter_config.json`), so a bad
checkpoint is reported with its reason before any engine sees it, and the others go on.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from operators.engine.adapters import check_adapter
from operators.engine.checkpoints import (
    STEP_DIR,
    TRINITY_MODEL_DIR,
    CheckpointError,
    TensorMetaMap,
    check_checkpoint,
    find_checkpoints,
    model_dir,
)
from pipelines.control.sync_policy import read_trainer_status
from schemas.lora_config import LoraConfig
from schemas.run_dir import trainer_status_path

DEFAULT_TIMEOUT_S = 3600.0
TRAILING_NUMBER = re.compile(r"(?:^|[-_])(\d+)$")


@dataclass(frozen=True)
class Candidate:
    """One model directory to benchmark, with the step its metrics are logged at."""

    path: Path
    step: int
    is_base: bool = False
    root: Path | None = None  # the --checkpoint-dir it was found in; a path the user named has none

    @property
    def label(self) -> str:
        if self.is_base:
            return "base"
        trinity = self.path.parts[-2:] == TRINITY_MODEL_DIR.parts  # name it by its global_step_N
        return self.path.parent.parent.name if trinity else self.path.name


def resolved(path: Path) -> str:
    """The path with links followed, as a key; a symlink loop cannot be followed and keys as itself (its
    check then reports it), rather than stopping the whole benchmark."""
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):  # RuntimeError: Python's "Symlink loop"
        return str(Path(path).absolute())


def checkpoint_step(path: Path, position: int) -> int:
    """`global_step_N` → N; a trailing number (`checkpoint-500`) → that number; else the 1-based position."""
    name = Path(path).name
    match = STEP_DIR.match(name) or TRAILING_NUMBER.search(name)
    return int(match.group(1)) if match else position


def select_candidates(
    checkpoints: Iterable[Path] = (),
    checkpoint_dir: Path | None = None,
    base: Path | None = None,
    latest_only: bool = False,
) -> list[Candidate]:
    """The checkpoints to run, by ascending step: the base (step 0) first, then the listed and found ones.

    Paths given in any order are sorted by their step; a path named twice is run once. With `latest_only`
    only the highest step is kept (and the base, when asked for).
    """
    found: list[Candidate] = []
    for position, path in enumerate(checkpoints, start=1):
        found.append(Candidate(model_dir(Path(path)), checkpoint_step(Path(path), position)))
    if checkpoint_dir is not None:
        found.extend(
            Candidate(path, step, root=Path(checkpoint_dir))
            for step, path in find_checkpoints(checkpoint_dir)
        )
    seen: set[str] = set()
    unique = []
    for candidate in sorted(found, key=lambda c: c.step):  # stable: ties keep the order given
        key = resolved(candidate.path)
        if key not in seen and (base is None or key != resolved(Path(base))):
            seen.add(key)
            unique.append(candidate)
    if latest_only and unique:
        unique = [c for c in unique if c.step == unique[-1].step][-1:]
    return ([Candidate(Path(base), 0, is_base=True)] if base is not None else []) + unique


@dataclass
class Selection:
    """Which checkpoints: listed paths, a `global_step_N` folder, the base; optionally watched."""

    checkpoints: list[Path] = field(default_factory=list)
    checkpoint_dir: Path | None = None
    include_base: bool = False
    latest_only: bool = False
    watch: bool = False
    timeout: float = DEFAULT_TIMEOUT_S


def check_architecture(directory: Path, base: Path) -> None:
    """Same `model_type` and `architectures` as the engine's model: the tensor checks alone miss a renamed
    architecture with the same tensors."""
    try:
        mine = json.loads((Path(directory) / "config.json").read_text())
        theirs = json.loads((Path(base) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{directory}: unreadable config.json ({exc})") from None
    for key in ("model_type", "architectures"):
        if mine.get(key) != theirs.get(key):
            raise CheckpointError(
                f"{directory}: incompatible architecture: {key} is {mine.get(key)!r}, "
                f"the engine runs {theirs.get(key)!r}"
            )


def check_candidate(
    candidate: Candidate, expected: TensorMetaMap, base: Path, lora: LoraConfig | None = None
) -> None:
    """Raise CheckpointError naming why this directory cannot be loaded into the engines. With `lora` (the
    run's LoRA config), every candidate but the base is an adapter of the base model (PEFT's or Trinity's)."""
    path = candidate.path
    if path.is_symlink() and not path.exists():
        raise CheckpointError(f"{path}: a symlink loop, or a link to nothing")
    if not path.exists():
        raise CheckpointError(f"{path}: not found")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    try:
        if lora is not None and not candidate.is_base:
            check_adapter(path, base, lora.max_lora_rank, lora.base_model_name)
            return
        check_checkpoint(path, expected, root=candidate.root)  # config.json, whole files, the model's tensors
        check_architecture(path, base)
    except (OSError, RuntimeError) as exc:  # a file in it loops or went away: its failure, not the bench's
        raise CheckpointError(f"{path}: {path_problem(exc)}") from None


def path_problem(exc: OSError | RuntimeError) -> str:
    """Why a checkpoint's files could not be followed or read, from the error `Path.resolve()` or `stat`
    raised: Python reports a symlink loop as RuntimeError("Symlink loop from ...") or as ELOOP."""
    if isinstance(exc, RuntimeError) or exc.errno == errno.ELOOP:
        return f"a symlink loop ({exc}): point the link at a real file, or remove it"
    return f"cannot be read ({exc.strerror or exc})"


def trainer_stopped(checkpoint_dir: Path | None) -> bool:
    """A trainer that says it has stopped writes no more checkpoints: watching can end early."""

    if checkpoint_dir is None:
        return False
    return read_trainer_status(str(trainer_status_path(checkpoint_dir))).state == "stopped"


@dataclass
class Failure:
    """A checkpoint that could not be measured, and why."""

    candidate: Candidate
    reason: str
