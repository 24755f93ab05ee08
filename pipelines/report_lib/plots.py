"""Every figure of a run, one function each, shared by the notebooks and `python -m pipelines.report`.

Figures are `matplotlib.figure.Figure`s drawn on the Agg canvas without pyplot: no global figure state to
leak between calls, safe off the main thread, and no display needed. `png_bytes` gives a notebook what it
shows (an `IPython.display.Image`) and `save_png` the report's files, so both show the same pixels.
A function returns None when the run holds nothing to draw (no eval, no time metrics).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.report_lib.mlflow_store import History, series
from pipelines.report_lib.summaries import (
    StepStats,
    eval_series,
    is_multi_turn,
    metric_names,
    response_lengths,
    reward_series,
    sampled_lengths,
    step_stats,
    values_by_step,
)

PANEL = (4.2, 3.3)  # inches per subplot
PER_ROW = 3
BAND_ALPHA = 0.2
BENCH_METRICS = ("accuracy", "mean_at_k", "pass_at_k", "response_length", "tokens_per_s")


def new_figure(panels: int, title: str) -> tuple[Any, list[Any]]:
    """A figure of `panels` subplots, at most `PER_ROW` to a row (so it stays readable on a page), laid
    out to fit, and its axes in order; a last row's unused cells are hidden."""
    from matplotlib.figure import Figure  # heavy, deferred: reading a run needs no plotting
    from matplotlib.ticker import MaxNLocator  # heavy, deferred: as above

    columns = min(panels, PER_ROW)
    rows = -(-panels // columns)
    figure = Figure(figsize=(PANEL[0] * columns, PANEL[1] * rows), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax in grid[panels:]:
        ax.set_visible(False)
    figure.suptitle(title)
    axes = list(grid[:panels])
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    return figure, axes


def legend_below(figure: Any, ax: Any) -> None:
    """One legend under the panels, for curves that every panel draws alike: a legend inside a panel
    would cover the band it explains."""
    handles, labels = ax.get_legend_handles_labels()
    wide = min(PER_ROW, sum(a.get_visible() for a in figure.axes))  # panels across
    if handles:
        columns = min(len(labels), 2 * wide, 4)
        figure.legend(handles, labels, loc="outside lower center", ncols=columns, fontsize="small")


def png_bytes(figure: Any, dpi: int = 100) -> bytes:
    """The figure as PNG bytes (for `IPython.display.Image` in a notebook)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def save_png(figure: Any, path: Path, dpi: int = 100) -> Path:
    """The figure as a PNG file at `path` (the report's images)."""
    Path(path).write_bytes(png_bytes(figure, dpi))
    return Path(path)


def spread_band(stats: StepStats) -> tuple[list[float], list[float]]:
    """Mean ± standard deviation at each step, clipped to the step's min and max: a reward in [0, 1] with
    mean 0.9 and std 0.3 has no values at 1.2, and the band must not suggest it has."""
    low = [max(m - d, lo) for m, d, lo in zip(stats.mean, stats.std, stats.minimum, strict=True)]
    high = [min(m + d, hi) for m, d, hi in zip(stats.mean, stats.std, stats.maximum, strict=True)]
    return low, high


def all_zero(values: Any) -> bool:
    """Whether a panel would be a flat line at 0 (say, model versions in a run without weight sync): such
    a panel is left out, since it shows nothing the facts table does not say."""
    return all(value == 0 for value in values)


def draw_spread(ax: Any, stats: StepStats, label: str = "", color: str | None = None) -> None:
    """A mean curve with its standard deviation shaded (within min and max) and min/max dotted: the
    spread, not just the mean."""
    (line,) = ax.plot(stats.steps, stats.mean, marker="o", label=f"{label} mean".strip(), color=color)
    low, high = spread_band(stats)
    band = f"{label} mean ± std (within min/max)".strip()
    ax.fill_between(stats.steps, low, high, alpha=BAND_ALPHA, color=line.get_color(), label=band)
    ax.plot(
        stats.steps, stats.minimum, ls=":", lw=1, color=line.get_color(), label=f"{label} min/max".strip()
    )
    ax.plot(stats.steps, stats.maximum, ls=":", lw=1, color=line.get_color())


def reward_figure(table: pa.Table) -> Any:
    """Reward and each of its parts (accuracy, format, ...) against step, with the spread over the step's
    experiences."""
    curves = reward_series(table)
    figure, axes = new_figure(len(curves), "reward and its parts per step")
    for ax, (name, stats) in zip(axes, curves.items(), strict=True):
        draw_spread(ax, stats)
        ax.set_title(name)
        ax.set_xlabel("step")
    legend_below(figure, axes[0])
    return figure


def taskset_figure(table: pa.Table, histories: History) -> Any | None:
    """A run over several tasksets, or with a selector: each taskset's reward per step (with its spread), and
    the selectors' own figures (`selector/<taskset>/<name>`) from MLflow. None for a single file-order one."""
    names = sorted(set(table.column("taskset").to_pylist())) if len(table) else []
    figures = [n for n in metric_names(list(histories), "selector/") if not n.endswith("/experiences")]
    if len(names) < 2 and not figures:
        return None
    figure, axes = new_figure(2 if figures else 1, "tasksets and the curriculum per step")
    tasksets = pc.field("taskset")
    for name in names:
        part = table.filter(tasksets == name)
        draw_spread(axes[0], step_stats(part.column("step"), part.column("reward")), name)
    axes[0].set_title("reward per taskset")
    axes[0].set_xlabel("step")
    axes[0].legend(fontsize="small")
    if figures:
        for metric in figures:
            axes[1].plot(*series(histories, metric), marker="o", label=metric.removeprefix("selector/"))
        axes[1].set_title("selector figures")
        axes[1].set_xlabel("step")
        axes[1].legend(fontsize="small")
    return figure


def response_length_figure(table: pa.Table) -> Any:
    """The distribution of response lengths at each step (a box per step); for multi-turn experiences also
    the sampled tokens alone, since inserted tool output inflates the whole length."""
    steps = table.column("step")
    panels = [("response tokens", values_by_step(steps, response_lengths(table)))]
    if is_multi_turn(table):
        panels.append(("sampled tokens (action_mask)", values_by_step(steps, sampled_lengths(table))))
    figure, axes = new_figure(len(panels), "response length per step")
    for ax, (name, grouped) in zip(axes, panels, strict=True):
        if grouped:
            ax.boxplot(list(grouped.values()), positions=list(grouped), widths=0.6)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel("tokens")
    return figure


def version_figure(table: pa.Table, histories: History) -> Any | None:
    """The model version the experiences were sampled on, per step, and their staleness against the
    trainer's newest version (`rollout/staleness/*`, measured at commit, so from MLflow). Each panel only
    when it is not all zeros; None when neither is (a run without weight sync)."""
    versions = table.column("model_version")
    staleness = [series(histories, f"rollout/staleness/{stat}") for stat in ("mean", "max", "min")]
    dropped = series(histories, "rollout/stale_dropped")
    show_versions = not all_zero(versions.to_pylist())
    show_staleness = not all_zero([v for _, values in staleness for v in values] + dropped[1])
    if not (show_versions or show_staleness):
        return None
    figure, axes = new_figure(show_versions + show_staleness, "model version and staleness")
    if show_versions:
        ax = axes.pop(0)
        draw_spread(ax, step_stats(table.column("step"), versions), "version")
        ax.set_title("model_version of the experiences")
        ax.set_xlabel("step")
        ax.legend(fontsize="small")
    if show_staleness:
        ax = axes[0]
        for stat, points in zip(("mean", "max", "min"), staleness, strict=True):
            ax.plot(*points, marker="o", label=stat)
        if any(dropped[1]):
            ax.bar(dropped[0], dropped[1], alpha=0.3, label="dropped as stale")
        ax.set_title("staleness (versions behind the trainer)")
        ax.set_xlabel("step")
        ax.legend(fontsize="small")
    return figure


def throughput_figure(histories: History) -> Any | None:
    """Generated tokens/s per step, and where each step's time went: every `time/*` metric (and the eval
    time at its step) as stacked bars."""
    tokens = series(histories, "rollout/tokens_per_s")
    timings = [*metric_names(list(histories), "time/"), *metric_names(list(histories), "eval/total_time")]
    if not tokens[0] and not timings:
        return None
    figure, axes = new_figure(2, "throughput and time per step")
    axes[0].plot(*tokens, marker="o")
    axes[0].set_title("rollout/tokens_per_s (over each step's sampling window)")
    axes[0].set_xlabel("step")
    steps = sorted({step for name in timings for step, _ in histories[name]})
    bottom = dict.fromkeys(steps, 0.0)
    for name in timings:
        values = dict(histories[name])
        heights = [values.get(step, 0.0) for step in steps]
        axes[1].bar(steps, heights, bottom=[bottom[s] for s in steps], label=name)
        for step, height in zip(steps, heights, strict=True):
            bottom[step] += height
    axes[1].set_title("seconds per step")
    axes[1].set_xlabel("step")
    if timings:
        axes[1].legend(fontsize="small")
    return figure


def eval_figure(eval_table: pa.Table, histories: History) -> Any | None:
    """Each eval taskset against the step it evaluates: accuracy (else the reward) with its spread over the
    eval experiences, and mean@k / pass@k from MLflow."""
    curves = eval_series(eval_table) if len(eval_table) else {}
    logged = {n.split("/")[1] for n in histories if n.startswith("eval/") and n.count("/") >= 2}
    tasksets = sorted(set(curves) | logged)
    if not tasksets:
        return None
    figure, axes = new_figure(len(tasksets), "eval per step")
    for ax, taskset in zip(axes, tasksets, strict=True):
        found = curves.get(taskset, {})
        name = "accuracy" if "accuracy" in found else "reward"  # the headline number of an eval
        if name in found:
            draw_spread(ax, found[name], name)
        else:  # the eval experiences are gone: MLflow's means still draw the curve
            ax.plot(*series(histories, f"eval/{taskset}/{name}/mean"), marker="o", label=f"{name} mean")
        for metric in metric_names(list(histories), f"eval/{taskset}/"):
            if "_at_" in metric:
                ax.plot(*series(histories, metric), marker="s", ls="--", label=metric.rsplit("/", 1)[1])
        ax.set_title(taskset)
        ax.set_xlabel("step")
    legend_below(figure, axes[0])
    return figure


def bench_figure(rows: list[dict[str, Any]]) -> Any:
    """Each benchmark metric against the checkpoint step, one line per taskset, its bootstrap interval
    (`<metric>_ci_low` to `_ci_high`) shaded. `rows` as `bench_results.csv` holds them (`runs.bench_rows`)."""
    done = [r for r in rows if r.get("status", "ok") == "ok"]
    names = [n for n in BENCH_METRICS if any(n in r for r in done)] or ["accuracy"]
    figure, axes = new_figure(len(names), "checkpoints")
    for ax, name in zip(axes, names, strict=True):
        for taskset in sorted({r["taskset"] for r in done}):
            points = sorted(
                (r for r in done if r["taskset"] == taskset and name in r), key=lambda r: r["step"]
            )
            steps = [r["step"] for r in points]
            ax.plot(steps, [r[name] for r in points], marker="o", label=taskset)
            if all(f"{name}_ci_low" in r for r in points):
                low, high = [r[f"{name}_ci_low"] for r in points], [r[f"{name}_ci_high"] for r in points]
                ax.fill_between(steps, low, high, alpha=BAND_ALPHA)
        ax.set_title(name.replace("_at_k", "@k"))
        ax.set_xlabel("checkpoint step")
    if done:
        axes[0].legend(fontsize="small")
    return figure


def commit_log_figure(log: pa.Table) -> Any:
    """The SQL sink's commit log as a trainer sees it: experiences per committed step, and the seconds
    between one commit and the next (how long a trainer polling the log waits for each step)."""
    figure, axes = new_figure(2, "SQL commit log")
    steps = log.column("step").to_pylist()
    axes[0].bar(steps, log.column("num_experiences").to_pylist())
    axes[0].set_title("experiences per committed step")
    axes[0].set_xlabel("step")
    times = log.column("committed_at").to_pylist()
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    axes[1].plot(steps[1:], gaps, marker="o")
    axes[1].set_title("seconds since the previous commit")
    axes[1].set_xlabel("step")
    return figure
