"""Step metrics from a committed step, named as in Trinity-RFT so dashboards carry over."""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from operators.rollout.eval_metrics import mean_at_k, pass_at_k
from operators.rollout.over_rollout import DEFERRED, SKIPPED
from operators.tasks.reader import TasksetPlan
from pipelines.control.throughput import generated_tokens, rate, sampling_window, window_seconds
from schemas.config import Config
from schemas.errors import STALE

SAMPLE_COLUMNS = ("uid", "model_version", "prompt_text", "response_text", "truth", "reward", "finish_reason")
FAILURE_COLUMNS = ("task_uid", "run_id_base", "repeat_times", "attempts", "message")


def stats(prefix: str, values: pa.Array) -> dict[str, float]:
    if not len(values):
        return {}
    low, high = pc.min_max(values).values()
    return {
        f"{prefix}/mean": pc.mean(values).as_py(),
        f"{prefix}/max": high.as_py(),
        f"{prefix}/min": low.as_py(),
    }


def experience_metrics(experiences: pa.Table) -> dict[str, float]:
    """What a committed step's experiences alone say: reward and length stats, count, model version."""
    lengths = pc.list_value_length(experiences.column("response_ids"))
    metrics = {
        **stats("rollout/reward", experiences.column("reward")),
        **stats("rollout/response_length", lengths),
        "pipeline/experience_count": float(len(experiences)),
    }
    if len(experiences):
        metrics["rollout/model_version"] = pc.mean(experiences.column("model_version")).as_py()
        metrics.update(stats("rollout/turns", experiences.column("turns")))
        metrics["rollout/trajectory_splits"] = float(trajectory_splits(experiences))
        metrics.update(reward_part_stats("rollout", experiences))
    return metrics


def taskset_metrics(experiences: pa.Table, names: list[str]) -> dict[str, float]:
    """`rollout/<taskset>/reward/{mean,max,min}`, its response lengths and experience count, per training
    taskset of a run with several (the count is 0 where a step drew none of it)."""
    metrics: dict[str, float] = {}
    column = experiences.column("taskset")
    for name in names:
        part = experiences.filter(pc.equal(column, name))
        lengths = pc.list_value_length(part.column("response_ids"))
        metrics.update(stats(f"rollout/{name}/reward", part.column("reward")))
        metrics.update(stats(f"rollout/{name}/response_length", lengths))
        metrics[f"rollout/{name}/experience_count"] = float(len(part))
    return metrics


def reward_part_stats(prefix: str, experiences: pa.Table) -> dict[str, float]:
    """`<prefix>/<part>/{mean,max,min}` for each reward part the workflow recorded (e.g. `accuracy`, or
    tool_math's `called_tool`, whose mean is the tool-call rate), over the experiences that have it."""
    parts = experiences.column("reward_parts").combine_chunks()
    names = pc.unique(parts.keys).to_pylist() if len(parts) else []
    metrics: dict[str, float] = {}
    for name in names:
        values = pc.list_element(pc.map_lookup(parts, name, "all"), 0)
        metrics.update(stats(f"{prefix}/{name}", pc.drop_null(values)))
    return metrics


def trajectory_splits(experiences: pa.Table) -> int:
    """Segments begun because a prompt did not extend the trajectory before it (not per_call segments)."""
    later = experiences.filter(pc.greater(experiences.column("segment"), 0))
    return sum(json.loads(m).get("trajectory_split", 0.0) > 0 for m in later.column("metrics").to_pylist())


def filtered_metrics(records: pa.Table) -> dict[str, float]:
    """`rollout/filtered/<op>`: the experiences each experience op dropped in the step (never written)."""
    if "filtered" not in records.column_names:
        return {}
    totals: dict[str, float] = {}
    for counts in records.column("filtered").to_pylist():
        for name, count in counts or []:
            totals[f"rollout/filtered/{name}"] = totals.get(f"rollout/filtered/{name}", 0.0) + count
    return totals


def step_metrics(
    experiences: pa.Table,
    records: pa.Table,
    seconds: float,
    reference_version: int = 0,
    dropped_stale: int = 0,
) -> dict[str, float]:
    """Experience metrics plus throughput, failures, what the experience ops dropped, and staleness against
    the trainer's newest version."""
    sampling = window_seconds(sampling_window(records))  # the step's own window (`throughput`)
    staleness = pc.subtract(pa.scalar(reference_version, pa.int64()), experiences.column("model_version"))
    return {
        **experience_metrics(experiences),
        **stats("rollout/staleness", staleness),
        "rollout/stale_dropped": float(dropped_stale),
        "rollout/tokens_per_s": rate(generated_tokens(experiences), sampling),
        "rollout/failed_tasks": float(len(failed_records(records))),
        "rollout/skipped_tasks": float(pc.sum(ended_early(records, SKIPPED)).as_py() or 0),
        "rollout/recycled_tasks": float(
            len(set(records.filter(ended_early(records, DEFERRED)).column("task_uid").to_pylist()))
        ),
        "rollout/stale_cancelled": float(pc.sum(ended_early(records, STALE)).as_py() or 0),
        **filtered_metrics(records),
        "time/step": seconds,
        "time/sampling": sampling,
        "time/rollout_tail": rollout_tail(records),
    }


def ended_early(records: pa.Table, prefix: str) -> pa.Array:
    """Which sub-runs ended on purpose, by their message: skipped or deferred by over-rollout, or cancelled
    as stale."""
    return pc.starts_with(pc.fill_null(records.column("message"), ""), prefix)


def rollout_tail(records: pa.Table, share: float = 0.9) -> float:
    """Seconds from when `share` of the step's sub-runs had finished to when the last one did: the tail."""
    ends = sorted(records.column("finished_at").to_pylist())
    if len(ends) < 2:
        return 0.0
    return ends[-1] - ends[math.ceil(share * len(ends)) - 1]


def sample_table(experiences: pa.Table, limit: int) -> dict[str, list[Any]]:
    """A few rollouts of the step for the MLflow samples table."""
    return experiences.select(list(SAMPLE_COLUMNS)).slice(0, limit).to_pydict()


def failed_records(records: pa.Table) -> pa.Table:
    """The step's failed sub-runs: not ok, and not ended on purpose (over-rollout, staleness; a deferred
    sub-run reports again with the next step)."""
    on_purpose = pc.or_(
        pc.or_(ended_early(records, SKIPPED), ended_early(records, STALE)), ended_early(records, DEFERRED)
    )
    return records.filter(pc.and_(pc.invert(records.column("ok")), pc.invert(on_purpose)))


def failure_table(records: pa.Table) -> dict[str, list[Any]]:
    """Every failed sub-run of the step with its message, kept in MLflow, not only printed."""
    return failed_records(records).select(list(FAILURE_COLUMNS)).to_pydict()


def eval_metrics(taskset: str, experiences: pa.Table, repeat_times: int) -> dict[str, float]:
    """`eval/<taskset>/<metric>/{mean,max,min}`, plus mean@k and pass@k over each task's k samples."""
    if not len(experiences):
        return {}
    prefix = f"eval/{taskset}"
    lengths = pc.list_value_length(experiences.column("response_ids"))
    metrics = {
        **stats(f"{prefix}/reward", experiences.column("reward")),
        **stats(f"{prefix}/response_length", lengths),
    }
    metrics.update(reward_part_stats(prefix, experiences))
    if repeat_times > 1:
        correct = pc.greater_equal(experiences.column("reward"), 1.0).to_pylist()
        per_task: dict[str, list[bool]] = {}
        for task, ok in zip(experiences.column("task_uid").to_pylist(), correct, strict=True):
            per_task.setdefault(task, []).append(ok)
        means = [mean_at_k(c, len(c)) for c in per_task.values()]
        passes = [pass_at_k(c, len(c)) for c in per_task.values()]  # k: the task's finished samples
        metrics[f"{prefix}/mean_at_{repeat_times}"] = sum(means) / len(means)
        metrics[f"{prefix}/pass_at_{repeat_times}"] = sum(passes) / len(passes)
    return metrics


def skipped_rows(
    cfg: Config, plan: TasksetPlan, eval_plans: dict[str, TasksetPlan]
) -> dict[str, tuple[int, str]]:
    """Per taskset, the rows `on_bad_row: skip` leaves out and the first reasons, joined: what a run reports
    (`Explorer`, as `pipeline/skipped_rows/<taskset>` at step 0), and a dry run tells beforehand."""
    plans = {cfg.buffer.explorer_input.taskset.name: plan, **eval_plans}
    return {name: (p.skipped_rows, "; ".join(p.skip_messages)) for name, p in plans.items() if p.skipped_rows}
