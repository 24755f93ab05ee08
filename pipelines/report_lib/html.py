"""HTML for a run: tables, the rollout browser and the report page, as strings.

The same strings are what a notebook shows (`IPython.display.HTML`) and what the report writes, so the
rollout browser has one implementation. Each fragment carries its own small stylesheet, scoped by class, so
it looks the same inside Jupyter's page and in the report. Every value from the run is escaped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from pipelines.report_lib.summaries import response_pieces

STYLE = """<style>
.rftflow { font-family: system-ui, sans-serif; font-size: 14px; color: #1b1b1b; }
.rftflow table { border-collapse: collapse; margin: 0.5em 0; }
.rftflow th, .rftflow td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
.rftflow th { background: #eef1f5; }
.rftflow pre { white-space: pre-wrap; word-break: break-word; margin: 0.3em 0; background: #f7f7f7;
  padding: 4px 6px; }
.rftflow details { border: 1px solid #ddd; border-radius: 4px; margin: 4px 0; padding: 3px 8px; }
.rftflow summary { cursor: pointer; }
.rftflow .sampled { color: #0b3d91; }
.rftflow .inserted { color: #8a8a8a; background: #ececec; font-style: italic; }
.rftflow .good { color: #1a7f37; } .rftflow .bad { color: #b42318; }
.rftflow img { max-width: 100%; }
</style>"""
Decoder = Callable[[Sequence[int]], str]


def cell(value: Any) -> str:
    """A table cell's text: floats to 4 significant digits, mappings and lists readable."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(cell(v) for v in value)
    return "" if value is None else str(value)


def table_html(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as an HTML table (columns: those given, else the first row's keys)."""
    if not rows:
        return '<div class="rftflow"><p><em>none</em></p></div>'
    columns = list(columns or rows[0])
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell(row.get(c)))}</td>" for c in columns) + "</tr>" for row in rows
    )
    return f'{STYLE}<div class="rftflow"><table><tr>{head}</tr>{body}</table></div>'


def response_html(row: dict[str, Any], decode: Decoder | None) -> str:
    """The response, with the tokens the model did not sample (inserted between calls, masked out of
    training) greyed. A single-turn response is its text; a multi-turn one is cut at `inserted_spans`, each
    piece decoded with `decode` (its token ids when there is no tokenizer)."""
    spans = row.get("inserted_spans") or []
    if not spans or not row.get("response_ids"):
        return f'<pre class="sampled">{escape(row.get("response_text") or "")}</pre>'
    parts = []
    for inserted, ids in response_pieces(row["response_ids"], spans):
        text = decode(ids) if decode else " ".join(map(str, ids)) + " "
        kind = "inserted" if inserted else "sampled"
        tip = "inserted: not sampled, masked out of training" if inserted else "sampled by the model"
        parts.append(f'<span class="{kind}" title="{tip}">{escape(text)}</span>')
    return f"<pre>{''.join(parts)}</pre>"


def rollout_summary(row: dict[str, Any]) -> str:
    """One line for a collapsed rollout: step, uid, reward (coloured), its parts, turns, finish reason."""
    reward = row.get("reward")
    mark = "good" if reward is not None and reward >= 1.0 else "bad"
    parts = row.get("reward_parts") or {}
    extra = f" ({escape(cell(parts))})" if parts else ""
    turns = row.get("turns") or 1
    segment = row.get("segment") or 0
    multi = f" · {turns} turns" + (f", segment {segment}" if segment else "") if turns > 1 or segment else ""
    return (
        f"step {row.get('step')} · <code>{escape(str(row.get('uid')))}</code> · "
        f'reward <b class="{mark}">{escape(cell(reward))}</b>{extra}{multi} · '
        f"{escape(str(row.get('finish_reason') or ''))} · version {row.get('model_version')}"
    )


def rollouts_html(rows: Sequence[dict[str, Any]], decode: Decoder | None = None) -> str:
    """The rollout browser: one collapsible block per experience with its prompt, truth and response; in a
    multi-turn response the inserted spans are greyed (hover for what they are)."""
    if not rows:
        return '<div class="rftflow"><p><em>no rollouts</em></p></div>'
    blocks = []
    for row in rows:
        blocks.append(
            f"<details><summary>{rollout_summary(row)}</summary>"
            f"<div>prompt</div><pre>{escape(row.get('prompt_text') or '')}</pre>"
            f"<div>truth: <code>{escape(str(row.get('truth') or ''))}</code></div>"
            f"<div>response</div>{response_html(row, decode)}</details>"
        )
    legend = (
        '<p>Responses: <span class="sampled">sampled by the model</span>, '
        '<span class="inserted">inserted between calls (masked out of training)</span>.</p>'
    )
    return f'{STYLE}<div class="rftflow">{legend}{"".join(blocks)}</div>'


def image_html(file_name: str, caption: str) -> str:
    """A figure of the report: a PNG beside index.html, by relative name, so the folder moves whole."""
    return f'<figure><img src="{escape(file_name)}" alt="{escape(caption)}"></figure>'


def page_html(title: str, sections: Sequence[tuple[str, str]]) -> str:
    """A self-contained HTML page: `sections` are (heading, HTML body) in order. The page carries the
    stylesheet once, in its head; the copies each fragment brings for a notebook cell are dropped."""
    body = "".join(
        f"<section><h2>{escape(heading)}</h2>{content.replace(STYLE, '')}</section>"
        for heading, content in sections
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title>{STYLE}</head>"
        f'<body class="rftflow"><h1>{escape(title)}</h1>{body}</body></html>\n'
    )


BENCH_ESTIMATES = ("accuracy", "mean_at_k", "pass_at_k", "response_length")


def bench_table_html(rows: Sequence[dict[str, Any]]) -> str:
    """`bench_results.csv` as a readable table: each estimate with its 95% interval in brackets."""

    def estimate(row: dict[str, Any], name: str) -> str:
        if name not in row:
            return ""
        low, high = row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high")
        interval = f" [{low:.3g}, {high:.3g}]" if low is not None and high is not None else ""
        return f"{row[name]:.3g}{interval}"

    shown = []
    for row in rows:
        entry = {
            "step": row.get("step"),
            "checkpoint": str(row.get("checkpoint", "")).rstrip("/").rsplit("/", 1)[-1],
            "taskset": row.get("taskset", ""),
            "k": row.get("k", ""),
        }
        entry.update({name.replace("_at_k", "@k"): estimate(row, name) for name in BENCH_ESTIMATES})
        entry["tokens/s"] = f"{row['tokens_per_s']:.0f}" if "tokens_per_s" in row else ""
        entry["status"] = row.get("status", "ok") + (f": {row['reason']}" if row.get("reason") else "")
        shown.append(entry)
    return table_html(shown)
