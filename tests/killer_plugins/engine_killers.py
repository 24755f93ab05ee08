"""Test doubles that kill an engine at a chosen moment, loaded with `plugin_dirs: [tests/killer_plugins]`.

An engine dying mid-request is a fault real parts cannot show on demand, so these are the real workflows,
except that once (the first task of step `kill_step`, marked by the file `marker`) they SIGKILL their
engine's process while their own request is in flight. Used by `tests/reliability/test_engine_restart.py`
(a run) and `test_bench_engine_death.py` (a benchmark).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path

import torch

from operators.engine.client import lookup_engine
from operators.workflows import MathWorkflow, register_workflow
from operators.workflows.eval_math import EvalMathWorkflow


def strikes(task) -> bool:
    """Whether this task is the one that kills: the first of step `kill_step` (the marker file says which)."""
    args = task.workflow_args
    marker = Path(args["marker"])
    if task.step != args["kill_step"] or marker.exists():
        return False
    marker.write_text(task.task_uid)
    return True


async def kill_mid_request(run, pid: int):
    """Start `run` (the real workflow's run), SIGKILL the engine process `pid` while its request is in
    flight, and return what the run returns: answered by the replacement engine."""
    request = asyncio.ensure_future(run)
    await asyncio.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    return await request


@register_workflow("double_engine_killer")
class EngineKillerDouble(MathWorkflow):
    """The math workflow, killing its engine once. With `mid_continuation` it waits for a moment when its
    request is in flight across the sync to `version` (cut by it and going on, with partial rollout) and
    strikes then; the marker says `cut`, or `missed` if the sync came while none of its requests was in
    flight."""

    async def run(self, task, engine, run_id_base=0, *, repeat_times=None):
        if not strikes(task):
            return await super().run(task, engine, run_id_base, repeat_times=repeat_times)
        args, marker = task.workflow_args, Path(task.workflow_args["marker"])
        actor = lookup_engine(engine.name)
        pid = (await actor.ready.remote())["pid"]
        if not args.get("mid_continuation"):
            run = super().run(task, engine, run_id_base, repeat_times=repeat_times)
            return await kill_mid_request(run, pid)
        sampling = {**task.rollout_args, "max_tokens": 200, "ignore_eos": True}
        long = dataclasses.replace(task, rollout_args=sampling)
        while await actor.get_model_version.remote() != args["version"]:
            request = asyncio.ensure_future(super().run(long, engine, run_id_base, repeat_times=repeat_times))
            while not request.done() and await actor.get_model_version.remote() != args["version"]:
                await asyncio.sleep(0.005)
            if request.done():
                continue
            await asyncio.sleep(0.05)  # the continuation under the new version is under way
            marker.write_text(f"cut {task.task_uid}")
            os.kill(pid, signal.SIGKILL)
            return await request
        marker.write_text("missed")
        return await super().run(long, engine, run_id_base, repeat_times=repeat_times)


@register_workflow("double_eval_engine_killer")
class EvalEngineKillerDouble(EvalMathWorkflow):
    """The eval workflow, killing its engine once (for checkpoint step `kill_step`), then saving to `held`
    what the replacement engine holds of the parameter `weight`."""

    async def run(self, task, engine, run_id_base=0, *, repeat_times=None):
        if not strikes(task):
            return await super().run(task, engine, run_id_base, repeat_times=repeat_times)
        args = task.workflow_args
        pid = (await lookup_engine(engine.name).ready.remote())["pid"]
        run = super().run(task, engine, run_id_base, repeat_times=repeat_times)
        experiences = await kill_mid_request(run, pid)
        held = await lookup_engine(engine.name).get_weight.remote(args["weight"])
        torch.save(held, args["held"])
        return experiences
