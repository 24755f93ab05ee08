"""The run report: `RUN_DIR/report/index.html` with the figures as PNG files beside it.

It is the notebooks' content without Jupyter: the same readers, the same figure functions and the same HTML,
so what a notebook shows and what the report shows cannot drift apart. The folder is self-contained
(relative image names), so it can be logged to MLflow, copied or opened from anywhere.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipelines.report_lib.experiences import read_eval, read_experiences, storage_type
from pipelines.report_lib.html import (
    bench_table_html,
    image_html,
    page_html,
    rollouts_html,
    table_html,
)
from pipelines.report_lib.mlflow_store import failures, metric_histories, run_record
from pipelines.report_lib.plots import (
    bench_figure,
    eval_figure,
    response_length_figure,
    reward_figure,
    save_png,
    taskset_figure,
    throughput_figure,
    version_figure,
)
from pipelines.report_lib.runs import BENCH, Run, bench_rows, config_field, run_config, token_decoder
from pipelines.report_lib.summaries import overview, reward_series, rollout_rows

log = logging.getLogger(__name__)

REPORT_DIR = "report"
INDEX = "index.html"
ROLLOUTS_SHOWN = 24
FAILURE_COLUMNS = ("step", "task_uid", "run_id_base", "attempts", "message")


@dataclass
class Report:
    """What `write_report` wrote."""

    folder: Path
    index: Path
    images: list[Path] = field(default_factory=list)


class PageBuilder:
    """Collects a page's sections, writing each figure as a PNG into the report folder as it goes."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.sections: list[tuple[str, str]] = []
        self.images: list[Path] = []

    def figure(self, heading: str, file_name: str, figure: Any | None) -> None:
        """A figure's section (none when the run had nothing to draw)."""
        if figure is None:
            return
        self.images.append(save_png(figure, self.folder / file_name))
        self.sections.append((heading, image_html(file_name, heading)))

    def html(self, heading: str, content: str) -> None:
        self.sections.append((heading, content))


SAMPLING = ("temperature", "top_p", "top_k", "max_tokens")


def config_facts(config: dict[str, Any]) -> dict[str, Any]:
    """What the run ran, from its config.yaml: the model, the tasksets and the training sampling."""
    several = config_field(config, "buffer.explorer_input.tasksets", []) or []
    taskset = (several[0] if several else config_field(config, "buffer.explorer_input.taskset", {})) or {}
    evals = config_field(config, "buffer.explorer_input.eval_tasksets", []) or []
    args = taskset.get("rollout_args") or {}
    sampling = [f"{name}={args[name]}" for name in SAMPLING if name in args]
    if "repeat_times" in taskset:
        sampling.append(f"n={taskset['repeat_times']}")
    return {
        "model": config_field(config, "model.model_path", "not recorded"),
        "taskset": ", ".join(f"{t.get('name')} ({t.get('path')})" for t in several or [taskset])
        if taskset
        else "not recorded",
        "eval tasksets": ", ".join(f"{e.get('name')} ({e.get('path')})" for e in evals) or "none",
        "sampling": ", ".join(sampling) or "not recorded",
    }


def explore_facts(run: Run, table: pa.Table, failed: list[dict[str, Any]]) -> dict[str, Any]:
    """An explore run at a glance: where it is, what it ran (model, tasksets, sampling), how long it took
    and the command that started it, its MLflow run, its store, and `summaries.overview`."""
    facts = {"run dir": str(run.root), **config_facts(run_config(run.root)), **run_record(run)}
    facts["MLflow run"] = run.run_id or "not recorded"
    facts["storage"] = storage_type(run.root)
    return {**facts, **overview(table, failed)}


def facts_html(facts: dict[str, Any]) -> str:
    """Facts as a two-column table."""
    return table_html([{"": key, "value": value} for key, value in facts.items()])


def reward_heading(table: pa.Table) -> str:
    """The reward figure's heading, naming the parts it draws (and only those)."""
    parts = [name for name in reward_series(table) if name != "reward"]
    return f"Reward and its parts ({', '.join(parts)}) per step" if parts else "Reward per step"


def explore_page(run: Run, page: PageBuilder) -> str:
    """An explore run's sections; returns the page title."""
    table = read_experiences(run.root)
    histories = metric_histories(run)
    failed = failures(run)
    page.html("Run", facts_html(explore_facts(run, table, failed)))
    if len(table):
        page.figure(reward_heading(table), "reward.png", reward_figure(table))
        page.figure("Tasksets and curriculum", "tasksets.png", taskset_figure(table, histories))
        page.figure("Response length per step", "response_length.png", response_length_figure(table))
        page.figure("Model version and staleness", "versions.png", version_figure(table, histories))
    else:
        page.html("Experiences", "<p>No committed step yet.</p>")
    page.figure("Throughput and time per step", "throughput.png", throughput_figure(histories))
    page.figure("Eval", "eval.png", eval_figure(read_eval(run.root), histories))
    page.html(f"Failed tasks ({len(failed)})", table_html(failed, FAILURE_COLUMNS))
    rows = rollout_rows(table, ROLLOUTS_SHOWN)
    page.html(f"Rollouts (a sample of {len(rows)})", rollouts_html(rows, token_decoder(run.root)))
    return f"rftflow run {run.root.name}"


def bench_page(run: Run, page: PageBuilder) -> str:
    """A bench run's sections; returns the page title."""
    rows = bench_rows(run.root)
    page.html(
        "Run", facts_html({"run dir": str(run.root), "MLflow parent run": run.run_id or "not recorded"})
    )
    page.figure("Metrics per checkpoint, with 95% bootstrap intervals", "bench.png", bench_figure(rows))
    page.html("Results", bench_table_html(rows))
    return f"rftflow bench {run.root.name}"


def write_report(run: Run) -> Report:
    """Write `report/` in the run dir afresh (an older report is replaced whole, so no stale figure stays)."""
    folder = run.root / REPORT_DIR
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    page = PageBuilder(folder)
    title = bench_page(run, page) if run.kind == BENCH else explore_page(run, page)
    index = folder / INDEX
    index.write_text(page_html(title, page.sections), encoding="utf-8")
    log.debug("report written: %s (%d figures)", index, len(page.images))  # the command prints where
    return Report(folder, index, page.images)
