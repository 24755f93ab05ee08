"""A stand-in workflow for the partial-rollout tests, loaded with `--plugin-dir tests/length_plugins`: the
real math workflow, sampled with `ignore_eos` to a length set by the step's parity, so every odd step ends
well before the even step beside it. The gate starts the next period before a sync (partial rollout), so the
sync after each short odd step finds the long even step's generations in flight, whatever the timing, and
the sync after an even step finds the next long step started. Lengths: `workflow_args.short`, `.long`."""

from __future__ import annotations

import dataclasses

from operators.workflows import MathWorkflow, register_workflow


@register_workflow("alternating_lengths")
class AlternatingLengths(MathWorkflow):
    async def run(self, task, engine, run_id_base: int = 0, *, repeat_times: int | None = None):
        length = task.workflow_args["long" if task.step % 2 == 0 else "short"]
        sampling = {**task.rollout_args, "max_tokens": length, "ignore_eos": True}
        task = dataclasses.replace(task, rollout_args=sampling)
        return await super().run(task, engine, run_id_base, repeat_times=repeat_times)
