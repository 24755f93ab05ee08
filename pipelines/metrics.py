"""Step metrics from a committed step, named as in Trinity-RFT so dashboards carry over."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

SAMPLE_COLUMNS = ("uid", "model_version", "prompt_text", "response_text", "truth", "reward", "finish_reason")


def stats(prefix: str, values: pa.Array) -> dict[str, float]:
    if not len(values):
        return {}
    low, high = pc.min_max(values).values()
    return {
        f"{prefix}/mean": pc.mean(values).as_py(),
        f"{prefix}/max": high.as_py(),
        f"{prefix}/min": low.as_py(),
    }


def step_metrics(experiences: pa.Table, records: pa.Table, seconds: float) -> dict[str, float]:
    """Reward and length stats, throughput over the step's wall time, and failure counts."""
    lengths = pc.list_value_length(experiences.column("response_ids"))
    tokens = pc.sum(lengths).as_py() or 0
    metrics = {
        **stats("rollout/reward", experiences.column("reward")),
        **stats("rollout/response_length", lengths),
        "rollout/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "rollout/failed_tasks": float(len(records) - pc.sum(records.column("ok")).as_py()),
        "pipeline/experience_count": float(len(experiences)),
        "time/step": seconds,
    }
    if len(experiences):
        metrics["rollout/model_version"] = pc.mean(experiences.column("model_version")).as_py()
    return metrics


def sample_table(experiences: pa.Table, limit: int) -> dict[str, list[Any]]:
    """A few rollouts of the step for the MLflow samples table."""
    return experiences.select(list(SAMPLE_COLUMNS)).slice(0, limit).to_pydict()
