"""The reference trainer beside an explore run (`--with-trainer`): started as a Ray actor following the run,
its `train/*` metrics logged into the run's MLflow run, its last checkpoint waited for, and stopped."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any


def start_trainer(explorer, lr: float | None = None) -> tuple:
    """The reference trainer as a Ray actor, following this run from the version it has reached."""
    from pipelines.reference.trainer import TrainerOptions, start_trainer_actor  # heavy (torch), deferred

    cfg = explorer.config
    options = TrainerOptions(
        run_dir=explorer.run_dir,
        model_path=Path(cfg.model.model_path).resolve(),
        method=cfg.synchronizer.sync_method,
        checkpoint_dir=explorer.checkpoint_dir,
        hub_name=explorer.hub_name,
        steps=explorer.plan.num_steps,
        first_version=explorer.state.model_version,
        timeout=cfg.synchronizer.sync_timeout,
        experience_buffer=cfg.buffer.trainer_input.experience_buffer,
        lora=cfg.model.lora,
        **({} if lr is None else {"lr": lr}),
    )
    return start_trainer_actor(options)


def follow_trainer(trainer: tuple, monitor: Any) -> tuple:
    """The trainer's `train/*` metrics logged into this run's MLflow run as steps are trained."""
    from pipelines.control.trainer_log import TrainerLog  # deferred with the rest of the driver (Ray, MLflow)

    actor, _ = trainer
    log = TrainerLog(actor, monitor)
    return log, asyncio.create_task(log.follow())


async def stop_following(log: Any, task: asyncio.Task) -> None:
    """Stop pulling, then take what the trainer made since the last pull."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # its failure is said by last_pull's
        await task
    log.last_pull()  # on the event loop, as every MLflow call of the run


async def finish_trainer(trainer: tuple, timeout: float) -> None:
    """Let the trainer write its last checkpoint, the one a benchmark will want.

    Only for checkpoints: a last version in memory or over broadcast has no explorer left to take it.
    """
    import ray  # heavy, deferred: --help and input errors answer without Ray

    _, running = trainer
    await asyncio.to_thread(ray.wait, [running], timeout=timeout)


def stop_trainer(trainer: tuple) -> None:
    import ray  # heavy, deferred: --help and input errors answer without Ray

    actor, _ = trainer
    with contextlib.suppress(Exception):  # a dead or stuck trainer is killed all the same
        ray.get(actor.stop.remote(), timeout=10)
    ray.kill(actor)
