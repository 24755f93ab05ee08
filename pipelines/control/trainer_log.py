"""The reference trainer's per-step metrics (`train/*`) in the explorer's MLflow run.

The driver is the only process that writes to MLflow, so it pulls the trainer actor's metrics as they come
(`TrainerActor.metrics_since`) and logs each at its step: training on step N makes version N, so `train/*` at
step N sit beside the `rollout/*` metrics of the experiences they were trained on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from operators.actors.names import get_within
from pipelines.control.tracking import MlflowMonitor

logger = logging.getLogger(__name__)
FOLLOW_S = 1.0  # how often the driver asks the trainer for new steps' metrics


class TrainerLog:
    """Pulls a trainer actor's metrics into an MLflow run, each step once."""

    def __init__(self, actor: Any, monitor: MlflowMonitor):
        self.actor, self.monitor = actor, monitor
        self.taken = 0
        self.logged = monitor.logged_steps("train/loss")  # a resumed run's, logged before a crash: not again

    def fetch(self) -> list[dict[str, float]]:
        """The metrics of the steps trained since those logged (a blocking actor call). Only `log` moves on:
        a fetch cut short by cancellation is fetched again."""
        return get_within(self.actor.metrics_since.remote(self.taken), "the trainer (its metrics)")

    def log(self, entries: list[dict[str, float]]) -> None:
        self.taken += len(entries)
        for metrics in entries:
            step = int(metrics["train/model_version"])
            if step not in self.logged:
                self.monitor.log_metrics(metrics, step)
                self.logged.add(step)

    async def follow(self) -> None:
        """Fetch in a thread and log on the event loop, as the explorer's own metrics are, until cancelled."""
        while True:
            self.log(await asyncio.to_thread(self.fetch))
            await asyncio.sleep(FOLLOW_S)

    def last_pull(self) -> None:
        """The steps trained since the last pull, before the trainer is stopped; a trainer that is gone
        already is said, not raised (its earlier steps are logged)."""
        try:
            self.log(self.fetch())
        except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more than the last metrics
            logger.warning("the trainer's last metrics could not be read (%s: %s)", type(exc).__name__, exc)
