"""Processes as /proc shows them: memory of a process tree, and files a process holds open.

What the endurance and shutdown checks read: resident memory that keeps rising over a long run, and engine
processes or run-directory files still held after `shutdown`, are the leaks they look for.
"""

from __future__ import annotations

import os
from pathlib import Path


def read_memory(pid: int) -> dict[str, int]:
    """`rss` and `peak_rss` of one process, in bytes; empty when it has gone or /proc has no such fields."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    fields = {"VmRSS": "rss", "VmHWM": "peak_rss"}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            out[fields[key]] = int(value.split()[0]) * 1024
    return out


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, from every thread's children list."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(c) for c in children.read_text().split()]
        except OSError:
            continue
    return sorted(set(found))


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants, parents first."""
    tree, frontier = [], [pid]
    while frontier:
        current = frontier.pop(0)
        tree.append(current)
        frontier += child_pids(current)
    return tree


def process_tree_memory(pid: int) -> dict[int, dict[str, int]]:
    return {p: m for p in process_tree(pid) if (m := read_memory(p))}


def open_files_under(root: Path, pid: int | None = None) -> list[str]:
    """Files under `root` that process `pid` (default: this one) holds open: none should outlive a run."""
    root = Path(root).resolve()
    found = []
    for fd in Path(f"/proc/{pid or os.getpid()}/fd").iterdir():
        try:
            target = Path(os.readlink(fd))
        except OSError:  # closed meanwhile
            continue
        if target.is_relative_to(root):
            found.append(str(target))
    return sorted(found)
