"""In-place weight sync vs an engine cold start, per weight source, side by side in one run.

For each model (the bundled tiny one and a ~100M-parameter random Llama built by `make_random_model.py`),
one engine actor is started the explorer's way (`EngineFleet.start`: launch + wait ready) and that time is the
cold start. Then, for each source, `--repeats` versions of the weights (the base tensors times a factor
that differs per version) are synced through the explorer's driver-side path, `WeightSyncer`:

- checkpoint: the trainer writes `global_step_N/` (timed apart: the trainer's cost), the syncer checks its
  headers and the engine reloads it from disk;
- memory: the trainer `ray.put`s the state dict and announces it on a weight hub (timed apart), the engine
  pulls it from the object store;
- broadcast: the trainer (a thread here, rank 0) announces the tensor list and sends the buckets over a
  gloo group opened once (timed apart) while the engine receives them.

Latency is the driver's `WeightSyncer.sync` call to its return; pause is how long the engine held new
requests back (its own report). After each sync two tensors are read back from the engine: they must equal
the sent ones cast to the engine's dtype and differ from what it held before, so no no-op is ever timed.
Target: latency <= 5% of a cold start.

With `--lora`, adapter sync instead (`lora_sync.py`): on one LoRA-enabled float32 engine per model, rank-16
adapters on every linear layer synced by checkpoint and by memory, delivery check included, against
full-weight syncs by the same method on the same engine; target: adapter / full <= 0.50. The last line gives
the worst method's ratio on the last model: `lora_sync: ratio=X.XX (target <= 0.50)`.

    python benchmarks/weight_sync.py [--models tiny,random] [--repeats 3] [--lora] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from common import parser, start_fleet
from lora_sync import LORA_TARGET, LoraBench, print_lora_table
from lora_sync import summary as lora_summary

SOURCES = ("checkpoint", "memory", "broadcast")
TARGET = 0.05
TIMEOUT_S = 600.0
# read back after each sync: a linear weight (packed into the CPU GEMM kernel) and the padded embedding
CHECKED = ("model.layers.0.self_attn.o_proj.weight", "model.embed_tokens.weight")


@dataclass
class SourceResult:
    trainer_s: list[float] = field(default_factory=list)  # write / put + announce / send (overlaps)
    latency_s: list[float] = field(default_factory=list)
    pause_s: list[float] = field(default_factory=list)
    nbytes: int = 0
    error: str = ""


@dataclass
class ModelResult:
    name: str
    path: str
    params: int = 0
    nbytes: int = 0
    engine_dtype: str = ""
    cold_start_s: float = 0.0
    group_open_s: float = 0.0
    sources: dict[str, SourceResult] = field(default_factory=dict)


def parse_args() -> argparse.Namespace:
    options = parser(__doc__, overrides=False, out=None)
    options.add_argument("--models", default="tiny,random", help="comma-separated: tiny, random")
    options.add_argument("--repeats", type=int, default=3, help="syncs per source")
    options.add_argument(
        "--lora", action="store_true", help="adapter sync vs full-weight sync (lora_sync.py)"
    )
    options.add_argument(
        "--random-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "llama-100m",
        help="where the ~100M random model is built once and reused",
    )
    args = options.parse_args()
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(args.models) - {"tiny", "random"}
    if unknown:
        options.error(f"unknown models {sorted(unknown)}; choose from tiny, random")
    return args


def model_dir(name: str, random_dir: Path) -> Path:
    """The bundled tiny model, or the random one (built on first use with make_random_model's builder)."""
    from schemas.config import DEFAULT_MODEL

    if name == "tiny":
        return DEFAULT_MODEL
    if not (random_dir / "config.json").is_file() or not list(random_dir.glob("*.safetensors")):
        from make_random_model import build  # benchmarks/ is on sys.path when run as a script

        print(f"building the random model in {random_dir} ...", flush=True)
        count = build(random_dir, hidden=768, layers=12)
        print(f"{random_dir}: {count / 1e6:.1f}M parameters", flush=True)
    return random_dir


def load_base(directory: Path) -> dict[str, Any]:
    """The model's tensors under their checkpoint names, as a trainer holds them."""
    from safetensors.torch import load_file

    from operators.engine.checkpoints import weight_files

    state: dict[str, Any] = {}
    for path in weight_files(directory):
        state.update(load_file(str(path)))
    return state


def perturbed(base: dict[str, Any], version: int) -> dict[str, Any]:
    """Version `version` of the weights: every tensor scaled by a factor no other version uses."""
    factor = 1.0 + 0.05 * version
    return {name: t * factor for name, t in base.items()}


def read_back(engine: Any) -> dict[str, Any]:
    """The checked tensors as the engine holds them now (its dtype, checkpoint layout)."""
    import ray

    return {name: ray.get(engine.get_weight.remote(name)) for name in CHECKED}


def check(before: dict[str, Any], after: dict[str, Any], sent: dict[str, Any]) -> str:
    """'' if the engine holds exactly the sent tensors (in its dtype) and they changed; else why not."""
    import torch

    for name, got in after.items():
        want = sent[name].to(got.dtype)
        if got.shape != want.shape or not torch.equal(got, want):
            diff = (got.float() - want.float()).abs().max().item() if got.shape == want.shape else "shape"
            return f"{name}: engine holds other values than sent (max abs diff {diff})"
        if torch.equal(got, before[name]):
            return f"{name}: unchanged by the sync"
    return ""


def timed(fn: Any, *args: Any) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


class Bench:
    """One model's engine, weight hub and syncers; `run` fills a ModelResult."""

    def __init__(self, name: str, path: Path, repeats: int, work: Path):
        from operators.engine.checkpoints import tensor_meta

        self.result = ModelResult(name, str(path))
        self.path, self.repeats, self.work = path, repeats, work
        self.expected = tensor_meta(path)
        self.base = load_base(path)
        self.result.params = sum(t.numel() for t in self.base.values())
        self.result.nbytes = sum(t.numel() * t.element_size() for t in self.base.values())
        self.version = 0
        self.engines: Any = None
        self.hub: Any = None
        self.group: Any = None

    def run(self) -> ModelResult:
        try:
            self.cold_start()
            self.result.engine_dtype = str(read_back(self.engine)[CHECKED[0]].dtype).removeprefix("torch.")
            for source in SOURCES:
                self.result.sources[source] = self.measure(source)
        finally:
            self.close()
        return self.result

    @property
    def engine(self) -> Any:
        return self.engines.handles[0]

    def cold_start(self) -> None:
        """One engine actor, the explorer's way: launch and wait until its model is loaded."""
        from schemas.config import Config

        cfg = Config.model_validate({"model": {"model_path": str(self.path)}})
        started = time.perf_counter()
        self.engines = start_fleet(cfg, f"bench-weight-sync-{self.result.name}")  # Ray is up: no Ray start
        self.result.cold_start_s = time.perf_counter() - started

    def measure(self, kind: str) -> SourceResult:
        import ray

        from operators.actors.hub import WeightHub
        from pipelines.control.weight_sync import CheckpointSource, HubSource, WeightSyncer

        out = SourceResult()
        root = self.work / self.result.name / "checkpoints"
        try:
            if kind == "checkpoint":
                source: Any = CheckpointSource(root, self.expected)
            else:
                if self.hub is None:
                    self.hub = ray.remote(WeightHub).options(num_cpus=0).remote()
                    ray.get(self.hub.latest_version.remote())  # started before anything is timed
                source = HubSource(self.hub, kind, self.expected)
            if kind == "broadcast":
                self.result.group_open_s = self.open_group()
            syncer = WeightSyncer(source, self.engines, TIMEOUT_S)
            for _ in range(self.repeats):
                self.sync_once(kind, syncer, root, out)
                if out.error:
                    break
        except Exception as exc:  # noqa: BLE001 - one source failing must not hide the others' figures
            out.error = f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300] if str(exc) else ''}"
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return out

    def sync_once(self, kind: str, syncer: Any, root: Path, out: SourceResult) -> None:
        """Hand one new version over as a trainer would, then time the driver's sync of it."""
        import ray

        from operators.engine.checkpoints import write_checkpoint
        from operators.engine.transfer import meta_of, send

        current, self.version = self.version, self.version + 1
        state = perturbed(self.base, self.version)
        before = read_back(self.engine)
        sender = None
        with ThreadPoolExecutor(1) as pool:
            if kind == "checkpoint":
                out.trainer_s.append(timed(write_checkpoint, root, self.version, state, self.path))
            elif kind == "memory":
                started = time.perf_counter()
                payload = {"kind": "memory", "state": [ray.put(state)], "meta": meta_of(state)}
                ray.get(self.hub.publish.remote(self.version, payload))
                out.trainer_s.append(time.perf_counter() - started)
                del payload
            else:
                ray.get(self.hub.publish.remote(self.version, {"kind": "broadcast", "meta": meta_of(state)}))
            started = time.perf_counter()
            if kind == "broadcast":
                sender = pool.submit(timed, send, self.group, state)
            outcome = syncer.sync(current)
            latency = time.perf_counter() - started
            if sender is not None:
                out.trainer_s.append(sender.result(timeout=TIMEOUT_S))
        if not outcome.ok:
            raise RuntimeError(f"sync to version {self.version} failed: {outcome.reason}")
        out.latency_s.append(latency)
        out.pause_s.append(outcome.pause_s)
        out.nbytes = outcome.nbytes
        out.error = check(before, read_back(self.engine), state)
        if kind == "checkpoint":  # keep only the newest on disk (the syncer's roll-back target)
            for old in root.glob("global_step_*"):
                if old.name != f"global_step_{self.version}":
                    shutil.rmtree(old, ignore_errors=True)

    def open_group(self) -> float:
        """Trainer rank 0 here, the engine's worker rank 1, over gloo; returns the seconds it took."""
        import ray
        import vllm.distributed.utils  # noqa: F401 - imported before the clock starts, as a trainer would be

        from operators.engine.transfer import open_group
        from pipelines.reference.trainer import free_port

        address, port = ray.util.get_node_ip_address(), free_port()
        started = time.perf_counter()
        joined = self.engine.open_weight_group.remote(address, port, 1, 2, "gloo", TIMEOUT_S)
        self.group = open_group(address, port, 0, 2, "gloo", TIMEOUT_S)
        ray.get(joined, timeout=TIMEOUT_S)
        return time.perf_counter() - started

    def close(self) -> None:
        import ray

        if self.engines is not None:
            self.engines.stop()
        if self.hub is not None:
            ray.kill(self.hub)
        self.engines = self.hub = self.group = None
        self.base = {}


def summary(result: ModelResult) -> dict[str, Any]:
    """Per-source figures: means, minimum, ratio to the cold start, and whether it meets the target."""
    rows = {}
    for kind, src in result.sources.items():
        row: dict[str, Any] = {"error": src.error}
        if src.latency_s:
            mean = statistics.mean(src.latency_s)
            row.update(
                trainer_mean_s=statistics.mean(src.trainer_s) if src.trainer_s else None,
                latency_mean_s=mean,
                latency_min_s=min(src.latency_s),
                pause_mean_s=statistics.mean(src.pause_s),
                ratio=mean / result.cold_start_s,
                meets_target=mean / result.cold_start_s <= TARGET,
            )
        rows[kind] = row
    return rows


def print_table(result: ModelResult, rows: dict[str, Any]) -> None:
    print()
    print(
        f"{result.name} ({result.path}): {result.params / 1e6:.1f}M params, {result.nbytes / 2**20:.1f} MiB "
        f"sent, engine dtype {result.engine_dtype}"
    )
    print(f"cold start (launch + ready): {result.cold_start_s:.2f} s")
    print(f"broadcast group opened once: {result.group_open_s:.2f} s")
    header = ("source", "trainer s", "latency mean", "latency min", "pause mean", "latency/cold", "<= 5%")
    print(f"{header[0]:<11}" + "".join(f"{h:>13}" for h in header[1:]))
    for kind, row in rows.items():
        if "latency_mean_s" in row:
            trainer = f"{row['trainer_mean_s']:.3f}" if row["trainer_mean_s"] is not None else "-"
            cells = (
                trainer,
                f"{row['latency_mean_s']:.3f}",
                f"{row['latency_min_s']:.3f}",
                f"{row['pause_mean_s']:.3f}",
                f"{100 * row['ratio']:.2f}%",
                "yes" if row["meets_target"] else "NO",
            )
            print(f"{kind:<11}" + "".join(f"{c:>13}" for c in cells))
        if row["error"]:
            print(f"{kind:<11}  FAILED: {row['error']}")
    print("trainer s: checkpoint write / ray.put + announce / send (runs during the sync); seconds are means")


def main() -> None:
    import ray

    from pipelines.control.runtime import init_ray
    from schemas.config import RayConfig

    args = parse_args()
    init_ray(RayConfig())
    results, failed, ratio = {}, False, None
    try:
        with tempfile.TemporaryDirectory(prefix="weight-sync-") as work:
            for name in args.models:
                path = model_dir(name, args.random_dir)
                if args.lora:
                    result: Any = LoraBench(name, path, args.repeats, Path(work)).run()
                    rows = lora_summary(result)
                    print_lora_table(result, rows)
                    ratios = [row["ratio"] for row in rows.values() if "ratio" in row]
                    ratio = max(ratios) if len(ratios) == len(rows) else None
                else:
                    result = Bench(name, path, args.repeats, Path(work)).run()
                    rows = summary(result)
                    print_table(result, rows)
                failed |= any(row["error"] for row in rows.values())
                results[name] = {**asdict(result), "summary": rows}
    finally:
        ray.shutdown()
    if args.out:
        machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}"
        target = LORA_TARGET if args.lora else TARGET
        report = {"machine": machine, "repeats": args.repeats, "target": target, "models": results}
        args.out.write_text(json.dumps(report, indent=2))
    if args.lora:
        print(f"lora_sync: ratio={'-' if ratio is None else f'{ratio:.2f}'} (target <= {LORA_TARGET:.2f})")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
