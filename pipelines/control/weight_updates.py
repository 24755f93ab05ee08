"""What the fleet loads (`WeightUpdate`), what it can put a fresh engine back on (`Restore`), and what a load
cost (`Loaded`): plain data shared by the fleet, the weight syncer and the bench.

A LoRA run's versions are adapters (`AdapterSpec`): the adapter's name, its delivery probe and, for one handed
over in memory, its PEFT config. Full-weight loads and adapter loads are the same kinds (`checkpoint`,
`memory`), told apart by `adapter`, so the fleet can refuse to mix them in one run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA version's adapter: its name (the version makes `<name>-v<N>`), its probe (`Probe` as a dict),
    the engines' `keep` (versions kept loaded) and, in memory, its PEFT config."""

    name: str
    probe: dict[str, list]
    keep: int
    config: dict[str, Any] | None = None


@dataclass(frozen=True)
class Restore:
    """The weights every engine holds, and how a fresh engine gets them: a directory, or a state dict's ref.

    Neither (a version that came by broadcast) means a replacement cannot be put on it.
    """

    version: int
    path: Path | None = None
    state: Any = None
    adapter: AdapterSpec | None = None

    @property
    def loadable(self) -> bool:
        return self.path is not None or self.state is not None

    def as_update(self) -> WeightUpdate:
        """The load that puts an engine on these weights (a loadable restore point only)."""
        kind = "checkpoint" if self.path is not None else "memory"
        return WeightUpdate(self.version, kind, path=self.path, state=self.state, adapter=self.adapter)


@dataclass
class WeightUpdate:
    """A version to load: a checked checkpoint directory, a state dict's object ref, or a broadcast."""

    version: int
    kind: str  # checkpoint | memory | broadcast
    path: Path | None = None
    state: Any = None
    meta: list | None = None
    bucket_bytes: int | None = None  # broadcast: the sender's bucket size, which the receivers must match
    preempt: bool = False  # cut the generations in flight, to go on under this version (partial rollout)
    adapter: AdapterSpec | None = None  # a LoRA run's version: the adapter at `path` or in `state`

    def restore_point(self) -> Restore:
        return Restore(self.version, path=self.path, state=self.state, adapter=self.adapter)


@dataclass
class Loaded:
    """What a load cost: the longest time an engine held requests back, and the bytes each engine loaded."""

    pause_s: float
    nbytes: int
    probe: dict[str, float] = field(default_factory=dict)  # an adapter's delivery probe, worst engine
