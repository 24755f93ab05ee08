"""A taskset of a million rows streams in bounded memory: planning counts rows (and keeps skipped row numbers
compactly), reading yields blocks of at most BLOCK_ROWS rows. Measured in a fresh process, so that what other
tests allocated does not blur the peak.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROWS = 1_000_000
BAD_EVERY = 10  # a bad line after every 10th row: 100,000 skipped rows to keep track of
RSS_BOUND_MIB = 32  # the file is ~60 MB; its parsed records alone would take ~450 MiB

MEASURE = """
import json, resource, sys, time
from pathlib import Path
from operators.tasks.reader import iter_task_tables, plan_taskset, read_units
from schemas.config import TasksetConfig

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def read(path):
    cfg = TasksetConfig(path=Path(path), on_bad_row="skip")
    started = time.perf_counter()
    plan = plan_taskset(cfg, 8, 1, None)
    planned = time.perf_counter()
    rows, largest, steps, last = 0, 0, set(), 0
    for unit in read_units(plan):
        for block in iter_task_tables(cfg, plan, *unit):
            rows, largest = rows + len(block), max(largest, len(block))
            step = set(block.column("step").to_pylist())
            assert len(step) == 1 and min(step) >= last, "a block spans steps, or steps go back"
            last = min(step)
    return plan, {"plan_s": planned - started, "read_s": time.perf_counter() - planned, "rows": rows,
                  "largest_block": largest, "steps": last}

read(sys.argv[2])  # first use imports what it needs (Arrow imports pandas): not part of what is measured
before = peak_mib()
plan, report = read(sys.argv[1])
report.update(rss_growth_mib=peak_mib() - before, skipped=plan.skipped_rows, reasons=len(plan.skip_messages))
print(json.dumps(report))
"""


def test_a_million_rows_stream_in_bounded_memory(tmp_path):
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    with big.open("w") as f:
        for i in range(ROWS):
            f.write(f'{{"prompt": "What is {i} + {i}?", "answer": "{2 * i}"}}\n')
            if i % BAD_EVERY == BAD_EVERY - 1:
                f.write('{"prompt": "a row without its answer"}\n')
    small.write_text('{"prompt": "1 + 1?", "answer": "2"}\n{"prompt": "no answer"}\n')
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(big), str(small)], cwd=root, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    print(f"1M rows, {big.stat().st_size / 1e6:.0f} MB: {report}")  # the figures docs/configuration.md quotes
    assert (report["rows"], report["steps"]) == (ROWS, ROWS // 8)
    assert (report["skipped"], report["reasons"]) == (ROWS // BAD_EVERY, 3)
    assert report["largest_block"] == 8
    assert report["rss_growth_mib"] < RSS_BOUND_MIB
