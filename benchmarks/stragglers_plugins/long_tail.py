"""Benchmark stand-in (not a real task): each task's `answer` is its own response length, drawn lognormal by
`benchmarks/stragglers.py`, and it is sampled to exactly that length (`ignore_eos`), so a step's lengths vary
by 10x or more whatever the model writes. Loaded with `plugin_dirs`, as a user's own workflows are."""

from __future__ import annotations

import dataclasses

from operators.workflows import SingleTurnWorkflow, register_workflow


@register_workflow("bench_long_tail")
class LongTail(SingleTurnWorkflow):
    async def run(self, task, engine, run_id_base: int = 0, *, repeat_times: int | None = None):
        sampling = {**task.rollout_args, "max_tokens": int(task.truth), "ignore_eos": True}
        task = dataclasses.replace(task, rollout_args=sampling)
        return await super().run(task, engine, run_id_base, repeat_times=repeat_times)
