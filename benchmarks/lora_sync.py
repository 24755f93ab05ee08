"""Adapter sync vs full-weight sync on one LoRA-enabled engine (`weight_sync.py --lora`).

One engine actor per model is started the explorer's way with `model.lora` (rank 16, all linear layers) and
`dtype: float32`, as a LoRA run needs. On it, for each method (checkpoint, memory):

- adapter sync: `--repeats` adapter versions (PEFT, random B matrices that differ per version) published the
  reference trainer's way (`write_version` / `memory_payload`, timed apart: the trainer's cost) and synced
  through `WeightSyncer` on the LoRA run's config: the checks, the load, and the engine's delivery probe,
  which must pass (its distances and the adapter's name are checked after each sync);
- full-weight sync: `--repeats` versions of the whole model (the base times a per-version factor) synced the
  same way, through a second fleet on the same engine handles whose config has no `model.lora` (the fleet
  refuses to mix the two kinds in one run, so the benchmark keeps one fleet per kind); the engine's copy of
  two tensors must equal the sent ones afterwards.

Each method's first sync of each kind is a warm-up, not counted (the first request under any adapter pays
for vLLM's LoRA code paths once). Adapters go first, while the engine holds the base weights their probes
were scored on. The ratio is the
adapter sync's mean latency over the full-weight sync's by the same method (target <= 0.5); the check's share
is the engine's probe time over the adapter sync's latency. Rollout tokens/s: the same seeded requests, first
with no adapter (the base, on the same LoRA-enabled engine), then under the last adapter loaded.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METHODS = ("checkpoint", "memory")
LORA_TARGET = 0.50
RANK = 16
TIMEOUT_S = 600.0
ROLLOUT = {"requests": 8, "max_tokens": 64}


@dataclass
class MethodResult:
    trainer_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    check_s: list[float] = field(default_factory=list)  # the engine's delivery probe (adapters only)
    nbytes: int = 0
    error: str = ""


@dataclass
class LoraModelResult:
    name: str
    path: str
    params: int = 0
    cold_start_s: float = 0.0
    adapter_params: int = 0
    adapter: dict[str, MethodResult] = field(default_factory=dict)
    full: dict[str, MethodResult] = field(default_factory=dict)
    tokens_per_s: dict[str, float] = field(default_factory=dict)  # base, adapter


def lora_config(path: Path) -> Any:
    from schemas.config import Config

    return Config.model_validate(
        {
            "model": {
                "model_path": str(path),
                "lora": {"lora_rank": RANK, "lora_alpha": 2 * RANK, "max_lora_rank": RANK},
            },
            "explorer": {"rollout_model": {"dtype": "float32"}},
        }
    )


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300] if str(exc) else ''}"


class LoraBench:
    """One model's LoRA-enabled engine, its two fleets (adapters, full weights), a PEFT trainer stand-in."""

    def __init__(self, name: str, path: Path, repeats: int, work: Path):
        from weight_sync import load_base  # benchmarks/ is on sys.path when run as a script

        from operators.engine.checkpoints import tensor_meta

        self.result = LoraModelResult(name, str(path))
        self.path, self.repeats, self.work = path, repeats, work
        self.cfg = lora_config(path)
        self.expected = tensor_meta(path)
        self.base = load_base(path)
        self.result.params = sum(t.numel() for t in self.base.values())
        self.version = 0
        self.fleet: Any = None
        self.full_fleet: Any = None
        self.hub: Any = None
        self.model: Any = None

    def run(self) -> LoraModelResult:
        try:
            self.start()
            self.result.tokens_per_s["base"] = self.rollout_rate()
            for method in METHODS:
                self.result.adapter[method] = self.measure(method, adapter=True)
            if all(not r.error for r in self.result.adapter.values()):
                self.result.tokens_per_s["adapter"] = self.rollout_rate()
            for method in METHODS:
                self.result.full[method] = self.measure(method, adapter=False)
        finally:
            self.close()
        return self.result

    def start(self) -> None:
        """The engine (its cold start timed), the trainer's PEFT model, the weight hub, the second fleet."""
        import ray
        from common import start_fleet
        from peft import get_peft_model

        from operators.actors.hub import WeightHub
        from operators.engine.peft_adapters import base_model, peft_config
        from pipelines.control.fleet import EngineFleet
        from schemas.config import Config

        started = time.perf_counter()
        self.fleet = start_fleet(self.cfg, f"bench-lora-sync-{self.result.name}")
        self.result.cold_start_s = time.perf_counter() - started
        full_cfg = Config.model_validate(
            {"model": {"model_path": str(self.path)}, "explorer": {"rollout_model": {"dtype": "float32"}}}
        )
        self.full_fleet = EngineFleet(full_cfg, f"bench-lora-sync-{self.result.name}")
        self.full_fleet.handles = self.fleet.handles  # the same engine, loaded as a full-weight run would
        self.model = get_peft_model(base_model(self.path), peft_config(self.cfg.model.lora))
        self.result.adapter_params = sum(p.numel() for n, p in self.model.named_parameters() if "lora_" in n)
        self.hub = ray.remote(WeightHub).options(num_cpus=0).remote()
        ray.get(self.hub.latest_version.remote())  # started before anything is timed

    def rollout_rate(self) -> float:
        """Generated tokens/s of `ROLLOUT` seeded requests at once, under what the engine samples with now."""
        import ray

        from operators.engine.peft_adapters import probe_ids

        engine, prompt = self.fleet.handles[0], probe_ids(self.path)[:16]
        sampling = {"n": 1, "max_tokens": ROLLOUT["max_tokens"], "temperature": 1.0, "ignore_eos": True}
        ray.get(engine.generate.remote(prompt, {**sampling, "seed": 0}))  # warm
        started = time.perf_counter()
        calls = [engine.generate.remote(prompt, {**sampling, "seed": i}) for i in range(ROLLOUT["requests"])]
        tokens = sum(len(s["response_ids"]) for g in ray.get(calls) for s in g["samples"])
        return tokens / (time.perf_counter() - started)

    def measure(self, method: str, adapter: bool) -> MethodResult:
        from pipelines.control.weight_sync import CheckpointSource, HubSource, WeightSyncer

        out = MethodResult()
        root = self.work / self.result.name / ("adapters" if adapter else "weights") / method
        cfg = self.cfg if adapter else None
        fleet = self.fleet if adapter else self.full_fleet
        try:
            if method == "checkpoint":
                source: Any = CheckpointSource(root, self.expected, lora_run=cfg)
            else:
                source = HubSource(self.hub, method, self.expected, lora_run=cfg)
            syncer = WeightSyncer(source, fleet, TIMEOUT_S)
            self.sync_once(method, adapter, syncer, root, MethodResult())  # warm-up, not timed
            for _ in range(self.repeats):
                self.sync_once(method, adapter, syncer, root, out)
        except Exception as exc:  # noqa: BLE001 - one method failing must not hide the others' figures
            out.error = error_text(exc)
        return out

    def sync_once(self, method: str, adapter: bool, syncer: Any, root: Path, out: MethodResult) -> None:
        """Publish one new version as a trainer would (timed apart), time the driver's sync, check it."""
        from weight_sync import check, perturbed

        current, self.version = self.version, self.version + 1
        before = None if adapter else self.read_back()
        started = time.perf_counter()
        if adapter:
            self.publish_adapter(method, root)
        else:
            self.publish_full(method, root)
        out.trainer_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        outcome = syncer.sync(current)
        latency = time.perf_counter() - started
        if not outcome.ok:
            raise RuntimeError(f"sync to version {self.version} failed: {outcome.reason}")
        out.latency_s.append(latency)
        out.nbytes = outcome.nbytes
        if adapter:
            out.check_s.append(outcome.probe["check_s"])
            self.check_adapter(outcome.probe)
        elif problem := check(before, self.read_back(), perturbed(self.base, self.version)):
            raise RuntimeError(problem)

    def publish_adapter(self, method: str, root: Path) -> None:
        """Version `self.version` of the adapter: new random B matrices, written or put with its probe."""
        import ray
        import torch

        from pipelines.reference.lora_trainer import memory_payload, write_version

        torch.manual_seed(self.version)
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.05)
        if method == "checkpoint":
            write_version(self.model, root, self.version, self.path)
        else:
            ray.get(self.hub.publish.remote(self.version, memory_payload(self.model, self.path, ray.put)))

    def publish_full(self, method: str, root: Path) -> None:
        import ray
        from weight_sync import perturbed

        from operators.engine.checkpoints import write_checkpoint
        from operators.engine.transfer import meta_of

        state = perturbed(self.base, self.version)
        if method == "checkpoint":
            write_checkpoint(root, self.version, state, self.path)
        else:
            payload = {"kind": "memory", "state": [ray.put(state)], "meta": meta_of(state)}
            ray.get(self.hub.publish.remote(self.version, payload))

    def read_back(self) -> dict[str, Any]:
        """The checked tensors as the engine holds them, under their checkpoint names: with LoRA enabled,
        vLLM keeps each adapted layer's own weight in its `base_layer`."""
        import ray
        from weight_sync import CHECKED

        engine = self.fleet.handles[0]
        wrapped = {name: name.replace(".weight", ".base_layer.weight") for name in CHECKED}
        return {name: ray.get(engine.get_weight.remote(inner)) for name, inner in wrapped.items()}

    def check_adapter(self, probe: dict[str, float]) -> None:
        """The engine samples under the version just synced, proven by its probe."""
        import ray

        name = ray.get(self.fleet.handles[0].current_adapter.remote())
        if name != f"lora-v{self.version}" or not probe["adapter_d"] <= 1e-3 < probe["base_d"]:
            raise RuntimeError(f"version {self.version}: engine on {name}, probe {probe}")

    def close(self) -> None:
        import ray

        if self.fleet is not None:
            self.fleet.stop()
        if self.hub is not None:
            ray.kill(self.hub)
        self.fleet = self.full_fleet = self.hub = self.model = None
        self.base = {}


def summary(result: LoraModelResult) -> dict[str, Any]:
    """Per method: mean latencies, the ratio adapter / full weights, the check's share of an adapter sync."""
    rows: dict[str, Any] = {}
    for method in METHODS:
        lora, full = result.adapter.get(method), result.full.get(method)
        row: dict[str, Any] = {"error": "; ".join(e for e in (lora and lora.error, full and full.error) if e)}
        if lora and full and lora.latency_s and full.latency_s:
            lora_mean, full_mean = statistics.mean(lora.latency_s), statistics.mean(full.latency_s)
            row.update(
                adapter_trainer_s=statistics.mean(lora.trainer_s),
                adapter_latency_s=lora_mean,
                adapter_bytes=lora.nbytes,
                check_s=statistics.mean(lora.check_s),
                check_share=statistics.mean(lora.check_s) / lora_mean,
                full_trainer_s=statistics.mean(full.trainer_s),
                full_latency_s=full_mean,
                full_bytes=full.nbytes,
                ratio=lora_mean / full_mean,
            )
        rows[method] = row
    return rows


def print_lora_table(result: LoraModelResult, rows: dict[str, Any]) -> None:
    print()
    print(
        f"{result.name} ({result.path}): {result.params / 1e6:.1f}M params, adapter rank {RANK} on all "
        f"linear layers: {result.adapter_params / 1e6:.2f}M params; engine float32, LoRA enabled"
    )
    print(f"cold start (launch + ready): {result.cold_start_s:.2f} s")
    header = ("method", "adapter s", "of it: check", "check share", "full s", "adapter/full", "<= 0.50")
    print(f"{header[0]:<11}" + "".join(f"{h:>14}" for h in header[1:]))
    for method, row in rows.items():
        if "ratio" in row:
            cells = (
                f"{row['adapter_latency_s']:.3f}",
                f"{row['check_s']:.3f}",
                f"{100 * row['check_share']:.0f}%",
                f"{row['full_latency_s']:.3f}",
                f"{row['ratio']:.2f}",
                "yes" if row["ratio"] <= LORA_TARGET else "NO",
            )
            print(f"{method:<11}" + "".join(f"{c:>14}" for c in cells))
            print(
                f"{'':<11}  trainer: adapter {row['adapter_trainer_s']:.3f} s "
                f"({row['adapter_bytes'] / 2**20:.1f} MiB), full weights {row['full_trainer_s']:.3f} s "
                f"({row['full_bytes'] / 2**20:.1f} MiB)"
            )
        if row["error"]:
            print(f"{method:<11}  FAILED: {row['error']}")
    rates = result.tokens_per_s
    if "adapter" in rates:
        print(
            f"rollout ({ROLLOUT['requests']} requests x {ROLLOUT['max_tokens']} tokens at once): base "
            f"{rates['base']:.1f} tokens/s, under the adapter {rates['adapter']:.1f} tokens/s "
            f"({rates['adapter'] / rates['base']:.2f}x)"
        )
    print("seconds are means; adapter s: the driver's sync, checks and delivery probe included")
