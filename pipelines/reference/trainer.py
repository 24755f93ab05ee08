"""`python -m pipelines.train`: a minimal GRPO trainer that closes the loop with the explorer, on CPU torch.

It reads committed experience steps in order (from the run's store, or from its experience queue when it has
one), takes one GRPO update per step (training on step N produces version N), and hands each version to the
explorer by the configured method:
- checkpoint: `global_step_N/` under the checkpoint dir, written aside and renamed, so it is never seen half
  written; plus `trainer_status.json` beside them;
- memory: the state dict put in the Ray object store and announced on the run's weight hub;
- broadcast: announced on the hub, then sent over a torch.distributed group (trainer rank 0) in buckets.

Each step's metrics (`train/*`: loss, entropy, KL to the starting weights, groups with zero advantage, the
learning rate, ...) are printed as a JSON line; beside the explorer (`--with-trainer`) the explorer's driver
also logs them to its MLflow run at step N (`pipelines.control.trainer_log`).

It is a reference for the explorer's side of the contract, not a production trainer.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as transformers_logging

from operators.actors.names import ACTOR_CALL_S, NAMESPACE, get_within
from operators.engine.checkpoints import find_checkpoints, tensor_meta, write_checkpoint
from operators.engine.transfer import meta_of, open_group, send
from operators.sinks.queue import QueueReader
from operators.sinks.reader import buffer_config, open_reader
from pipelines.reference.grpo import GRPOConfig, make_optimizer, train_on_experiences
from pipelines.reference.lora_trainer import adapted, memory_payload, write_version
from schemas.atomic import atomic_write_json
from schemas.config import DEFAULT_MODEL, ExperienceBufferConfig, LoraConfig
from schemas.run_dir import CHECKPOINTS, checkpoint_dir_name, trainer_status_path
from schemas.storage import Location, as_location, base_name

POLL_S = 0.2
EPILOG = """\
examples:
  python -m pipelines.train --run-dir runs/demo                    # follow a checkpoint-sync explore run
  python -m pipelines.explore --with-trainer --set synchronizer.sync_method=checkpoint   # both at once

The explorer must use the same method (synchronizer.sync_method) and, for checkpoint, the same directory.
"""


@dataclass
class TrainerOptions:
    run_dir: Location  # a local path or an object-store URI (`schemas.storage`)
    model_path: Path = DEFAULT_MODEL
    method: str = "checkpoint"
    checkpoint_dir: Path | None = None  # default: <run dir>/checkpoints
    hub_name: str | None = None  # default: <run dir name>/weights
    steps: int | None = None  # stop after this many versions (default: when idle)
    idle_timeout: float = 600.0  # stop when no new step commits for this long
    lr: float = 2e-4
    seed: int = 0
    first_version: int = 0
    timeout: float = 1200.0  # broadcast group and transfer timeout
    experience_buffer: ExperienceBufferConfig | None = None  # default: the run's, from its config.yaml
    lora: LoraConfig | None = None  # train and publish a LoRA adapter (`pipelines.reference.lora_trainer`)
    log: list[dict[str, float]] = field(default_factory=list)
    echo: bool = True  # each step's metrics as a JSON line (the CLI; beside an explorer they go to MLflow)


class Trainer:
    """One GRPO update per committed explore step; publishes each new version as it is made."""

    def __init__(self, options: TrainerOptions):

        self.options = options
        torch.manual_seed(options.seed)
        torch.set_num_threads(1)  # beside the engines on a laptop; the tiny model needs no more
        source = options.model_path
        if options.first_version > 0:
            source = self.checkpoint_dir / checkpoint_dir_name(options.first_version)
        if options.lora is not None:  # the base stays; the adapter (a resumed version's, or the start) trains
            start = source if options.first_version > 0 else options.lora.path
            base = AutoModelForCausalLM.from_pretrained(options.model_path, dtype=torch.float32)
            self.model = adapted(base, options.lora, start)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        self.model.eval()
        # the base weights, for train/kl_to_start: how far training moved the policy (a resumed trainer too)
        self.start = AutoModelForCausalLM.from_pretrained(options.model_path, dtype=torch.float32)
        self.start.eval().requires_grad_(False)
        tokenizer = AutoTokenizer.from_pretrained(options.model_path)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.grpo = GRPOConfig(lr=options.lr)
        self.optimizer = make_optimizer(self.model, self.grpo)
        self.names = list(tensor_meta(options.model_path))  # what a version must hold (no tied copies)
        self.version = options.first_version
        self.stopping = threading.Event()
        self.hub: Any = None
        self.group: Any = None
        self.device = "cpu"

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.options.checkpoint_dir or Path(self.options.run_dir) / CHECKPOINTS)

    def run(self) -> int:
        """Train until `steps` versions, an idle timeout, or `stop()`; returns the last version made."""
        self._set_status("running")
        try:
            for step, experiences in [] if self._enough() else self._committed_steps():
                metrics = self._train(experiences)
                self.version = step
                self._publish()
                metrics["train/model_version"] = float(step)
                self.options.log.append(metrics)
                if self.options.echo:
                    print(json.dumps({"step": step, **metrics}), file=sys.stderr, flush=True)
                if self._enough():
                    break
        finally:
            self._set_status("stopped")
        return self.version

    def stop(self) -> None:
        self.stopping.set()

    def _enough(self) -> bool:
        return self.options.steps is not None and self.version >= self.options.steps

    def _committed_steps(self) -> Iterator[tuple[int, pa.Table]]:
        """The steps after this version, in order: from the run's experience queue if any, else its store.

        Ends on `stop()`, or when no step comes for `idle_timeout` seconds.
        """

        run_dir = as_location(self.options.run_dir)
        buffer = self.options.experience_buffer or buffer_config(run_dir)
        wait = {"poll_s": POLL_S, "idle_timeout": self.options.idle_timeout, "stop": self.stopping}
        if buffer.queue_capacity is not None:
            return iter(QueueReader(base_name(run_dir), after=self.version, **wait))
        return open_reader(run_dir, buffer).steps(self.version + 1, follow=True, **wait)

    def _train(self, experiences: pa.Table) -> dict[str, float]:

        return train_on_experiences(
            self.model, self.optimizer, experiences, self.grpo, self.pad_id, reference=self.start
        )

    def state_dict(self) -> dict[str, Any]:
        state = self.model.state_dict()
        return {name: state[name].detach().clone() for name in self.names}

    # -- handing versions over --------------------------------------------------------------------------

    def _publish(self) -> None:
        method = self.options.method
        if self.options.lora is not None and method == "checkpoint":
            write_version(self.model, self.checkpoint_dir, self.version, self.options.model_path)
            self._set_status("require_sync")
        elif self.options.lora is not None:
            payload = memory_payload(self.model, self.options.model_path, ray.put)
            get_within(self._hub().publish.remote(self.version, payload), "the weight hub (publish)")
        elif method == "checkpoint":
            write_checkpoint(self.checkpoint_dir, self.version, self.state_dict(), self.options.model_path)
            self._set_status("require_sync")
        elif method == "memory":
            state = self.state_dict()
            payload = {"kind": "memory", "state": [ray.put(state)], "meta": meta_of(state)}
            get_within(self._hub().publish.remote(self.version, payload), "the weight hub (publish)")
        else:
            self._broadcast()

    def _broadcast(self) -> None:
        """Announce the version, then send it; the send returns once the explorer's engines have it."""

        if self.group is None:
            self.group, self.device = self._open_group()
        state = {name: t.to(self.device) for name, t in self.state_dict().items()}
        get_within(
            self._hub().publish.remote(self.version, {"kind": "broadcast", "meta": meta_of(state)}),
            "the weight hub",
        )
        send(self.group, state)

    def _open_group(self) -> tuple[Any, str]:
        """Rank 0 of the explorer's group, on its engines' backend; returns the group and the send device."""

        hub = self._hub()
        workers = get_within(
            hub.wait_workers.remote(self.options.timeout),
            "the weight hub",
            self.options.timeout + ACTOR_CALL_S,
        )
        if workers is None:
            raise RuntimeError(
                f"no explorer registered on {self.options.hub_name} within {self.options.timeout}s"
            )
        backend = get_within(hub.group_backend.remote(), "the weight hub (group backend)")
        if backend == "nccl" and not torch.cuda.is_available():
            raise RuntimeError("the explorer's engines use NCCL (GPUs): broadcast needs a trainer on a GPU")
        address = ray.util.get_node_ip_address()
        port = free_port()
        get_within(hub.offer_group.remote(address, port), "the weight hub (offer the group)")
        group = open_group(address, port, 0, 1 + workers, backend, self.options.timeout)
        return group, "cuda" if backend == "nccl" else "cpu"

    def _hub(self) -> Any:
        if self.hub is None:
            name = self.options.hub_name or f"{base_name(self.options.run_dir)}/weights"
            self.hub = ray.get_actor(name, namespace=NAMESPACE)
        return self.hub

    def _set_status(self, state: str) -> None:
        if self.options.method == "checkpoint":
            path = trainer_status_path(self.checkpoint_dir)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, {"state": state, "version": self.version})
        else:
            get_within(self._hub().set_status.remote(state), "the weight hub (status)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class TrainerActor:
    """The trainer as a Ray actor beside the explorer (`explore --with-trainer`); `stop` ends `run`."""

    def __init__(self, options: TrainerOptions):
        # the explorer's console is its progress bar: the steps' metrics reach it through MLflow
        # (`metrics_since`), and Transformers' weight-loading bar is not the run's business
        transformers_logging.disable_progress_bar()
        self.trainer = Trainer(replace(options, echo=False))

    def run(self) -> dict[str, Any]:
        version = self.trainer.run()
        return {"version": version, "log": self.trainer.options.log}

    def metrics_since(self, taken: int) -> list[dict[str, float]]:
        """The steps' metrics after the first `taken` (the driver pulls them into MLflow as they come)."""
        return list(self.trainer.options.log[taken:])

    def stop(self) -> None:
        self.trainer.stop()


def start_trainer_actor(options: TrainerOptions) -> tuple[Any, Any]:
    """The trainer actor and its running `run()` call; fractional CPU so it never starves the read tasks.
    Three calls at once: `run`, and `stop` or `metrics_since` while it runs."""
    actor = ray.remote(TrainerActor).options(num_cpus=0.25, max_concurrency=3).remote(options)
    return actor, actor.run.remote()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.train",
        description="A minimal GRPO trainer for the tiny default model: reads an explore run's committed "
        "experiences and publishes a new model version per step.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run-dir", type=Path, required=True, help="the explore run to train on")
    parser.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_MODEL,
        help="base model (default: the bundled tiny model, %(default)s)",
    )
    parser.add_argument(
        "--method",
        choices=["checkpoint", "memory", "broadcast"],
        default="checkpoint",
        help="hand-over method (default: %(default)s)",
    )
    parser.add_argument("--checkpoint-dir", type=Path, help="default: RUN_DIR/checkpoints")
    parser.add_argument(
        "--steps", type=int, help="stop after this many versions (default: when the run is finished, or idle)"
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="stop when no step commits for this long, in seconds (default: %(default)s)",
    )
    parser.add_argument("--lr", type=float, default=2e-4, help="AdamW learning rate (default: %(default)s)")
    parser.add_argument(
        "--ray-address",
        default="auto",
        help="Ray cluster of the explorer (memory, broadcast; default: %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.method != "checkpoint":
        ray.init(address=args.ray_address, namespace=NAMESPACE, include_dashboard=False)
    options = TrainerOptions(
        run_dir=args.run_dir.resolve(),
        model_path=args.model.resolve(),
        method=args.method,
        checkpoint_dir=args.checkpoint_dir,
        steps=args.steps,
        idle_timeout=args.idle_timeout,
        lr=args.lr,
    )
    if args.method == "checkpoint":  # a restarted trainer goes on from its newest checkpoint (new optimizer)
        found = find_checkpoints(options.checkpoint_dir or options.run_dir / CHECKPOINTS)
        options.first_version = found[-1][0] if found else 0
    version = Trainer(options).run()
    print(f"rftflow train finished at version {version}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
