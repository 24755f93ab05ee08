"""The run's throughput figures, each defined once (README, "Throughput"):

- a step's `rollout/tokens_per_s`: its generated tokens over its own sampling window, from the first of its
  sub-runs starting (`finished_at - task_run_time`) to the last one finishing. Steps overlap, so the time
  between two commits says nothing about a step's rate;
- the run's rate (the summary, the progress bar): all generated tokens over the sampling time, the union of
  the steps' windows, so an overlap is counted once, and engine start, evals and shutdown not at all;
- a step's `rollout/idle_ratio`: the engines' time with nothing in flight over its sampling window, times the
  number of engines. A step that sampled tokens kept an engine busy inside its window, so it is below 1.
"""

from __future__ import annotations

import bisect

import pyarrow as pa
import pyarrow.compute as pc

Window = tuple[float, float]  # wall-clock seconds (time.time()): first sub-run start, last sub-run end


def generated_tokens(experiences: pa.Table) -> int:
    """Every token of the experiences' responses (in multi-turn, also those inserted between calls)."""
    return pc.sum(pc.list_value_length(experiences.column("response_ids"))).as_py() or 0


def sampling_window(records: pa.Table) -> Window | None:
    """From the first of the step's sub-runs starting to the last one finishing; None with no sub-run."""
    if not len(records):
        return None
    ends = records.column("finished_at")
    starts = pc.subtract(ends, pc.fill_null(records.column("task_run_time"), 0.0))
    return pc.min(starts).as_py(), pc.max(ends).as_py()


def window_seconds(window: Window | None) -> float:
    return 0.0 if window is None else max(0.0, window[1] - window[0])


def rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def union_seconds(windows: list[Window]) -> float:
    """The time covered by at least one window: overlapping steps are counted once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(windows):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


class BusyClock:
    """The engines' summed busy seconds (`EngineFleet.counters()["busy_s"]`) as read at wall-clock times,
    so the busy time inside any past window can be estimated: linearly between readings, exact at them."""

    def __init__(self, at: float, busy: float):
        self.times, self.busy = [at], [busy]

    def read(self, at: float, busy: float) -> None:
        """A new reading; a replaced engine counts afresh, so the total never goes back."""
        self.times.append(max(at, self.times[-1]))
        self.busy.append(max(busy, self.busy[-1]))

    def busy_at(self, at: float) -> float:
        i = bisect.bisect_right(self.times, at)
        if i == 0:
            return self.busy[0]
        if i == len(self.times):
            return self.busy[-1]
        t0, t1, b0, b1 = self.times[i - 1], self.times[i], self.busy[i - 1], self.busy[i]
        return b0 + (b1 - b0) * (at - t0) / (t1 - t0) if t1 > t0 else b1

    def idle_ratio(self, window: Window | None, engines: int) -> float:
        """Share of `engines` x the window with nothing in flight (0 for an empty window)."""
        seconds = window_seconds(window)
        if seconds <= 0 or engines < 1:
            return 0.0
        busy = self.busy_at(window[1]) - self.busy_at(window[0])
        return min(1.0, max(0.0, 1.0 - busy / (seconds * engines)))
