"""The benchmark's comparison outputs: a CSV and a Markdown table, and a plot of each metric against step.

Kept apart from the benchmark loop: these are pure functions of the result rows, tested without engines.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from pipelines.benchmark.selection import Failure
from pipelines.report_lib.plots import bench_figure, save_png
from schemas.run_dir import BENCH_PLOT, BENCH_RESULTS_CSV, BENCH_RESULTS_MD

TABLE_CSV = BENCH_RESULTS_CSV
TABLE_MD = BENCH_RESULTS_MD
PLOT_PNG = BENCH_PLOT
ESTIMATED = ("accuracy", "mean_at_k", "pass_at_k", "response_length")
MEASURED = ("tokens_per_s", "failed_tasks", "num_tasks")


def table_rows(records: list[dict[str, Any]], failures: list[Failure]) -> list[dict[str, Any]]:
    """One row per checkpoint and taskset (failed checkpoints: one row with the reason), by step."""
    rows = []
    for r in records:
        row = {"step": r["step"], "checkpoint": r["checkpoint"], "weights_hash": r["weights_hash"]}
        row.update({"taskset": r["taskset"], "k": r["k"], "status": "ok", "reason": ""})
        row.update(r["metrics"])
        rows.append(row)
    for f in failures:
        row = {"step": f.candidate.step, "checkpoint": str(f.candidate.path), "weights_hash": ""}
        rows.append({**row, "taskset": "", "k": "", "status": "failed", "reason": f.reason})
    return sorted(rows, key=lambda row: (row["step"], row["checkpoint"], row["taskset"]))


def csv_columns() -> list[str]:
    columns = ["step", "checkpoint", "weights_hash", "taskset", "k", "status"]
    for name in ESTIMATED:
        columns += [name, f"{name}_ci_low", f"{name}_ci_high"]
    return [*columns, *MEASURED, "reason"]


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=csv_columns(), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A compact table for a README or a PR: estimates with their 95% interval in brackets."""

    def interval(row: dict[str, Any], name: str, digits: int = 3) -> str:
        if name not in row:
            return ""
        low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
        return f"{row[name]:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"

    head = (
        "| step | checkpoint | weights | taskset | accuracy | mean@k | pass@k | response length | tokens/s |"
    )
    head += " status |\n|---|---|---|---|---|---|---|---|---|---|\n"
    lines = []
    for row in rows:
        k = row["k"]
        status = row["status"] if row["status"] == "ok" else f"failed: {row['reason']}".replace("|", "\\|")
        cells = [
            str(row["step"]),
            Path(row["checkpoint"]).name,
            row["weights_hash"][:12],
            row["taskset"],
            interval(row, "accuracy"),
            (f"k={k}: " + interval(row, "mean_at_k")) if "mean_at_k" in row else "",
            (f"k={k}: " + interval(row, "pass_at_k")) if "pass_at_k" in row else "",
            interval(row, "response_length", 1),
            f"{row['tokens_per_s']:.0f}" if "tokens_per_s" in row else "",
            status,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Each metric against the checkpoint step, one line per taskset, its 95% interval shaded: the report's
    and the notebooks' figure (`pipelines.report_lib.plots.bench_figure`), so it is drawn one way."""
    save_png(bench_figure(rows), path)


def write_outputs(rows: list[dict[str, Any]], run_dir: Path) -> dict[str, Path]:
    outputs = {"table": run_dir / TABLE_CSV, "markdown": run_dir / TABLE_MD, "plot": run_dir / PLOT_PNG}
    write_csv(rows, outputs["table"])
    outputs["markdown"].write_text(markdown_table(rows))
    plot(rows, outputs["plot"])
    return outputs
