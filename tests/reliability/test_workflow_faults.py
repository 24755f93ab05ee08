"""Workflow faults on the real stack: each failing task is marked failed with its message, counted, and never
written as an experience, while the good tasks of the same step land.

`double_faulty` is a test double: the real math workflow with one fault per task, chosen by the task's index
(raising, hanging, and three kinds of malformed experience), faults no real workflow shows on demand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
from integration_settings import BASE
from mlflow import MlflowClient

from pipelines.explore import explore
from schemas.config import load_config

FAULTY = """
import asyncio

from operators.workflows import MathWorkflow, register_workflow

FAULTS = ["raise", "hang", "short_logprobs", "nan_reward", "empty_response", None, None, None]


@register_workflow("double_faulty")
class FaultyDouble(MathWorkflow):
    async def run(self, task, engine, run_id_base=0, *, repeat_times=None):
        fault = FAULTS[task.index % len(FAULTS)]
        if fault == "raise":
            raise RuntimeError("double_faulty: boom")
        if fault == "hang":
            await asyncio.sleep(3600)
        experiences = await super().run(task, engine, run_id_base, repeat_times=repeat_times)
        for experience in experiences:
            if fault == "short_logprobs":
                experience.logprobs = experience.logprobs[:-1]
            elif fault == "nan_reward":
                experience.reward = float("nan")
            elif fault == "empty_response":
                experience.response_ids, experience.logprobs = [], []
        return experiences
"""

EXPECTED = {  # task index -> what its failure message must say
    0: "attempt 2: RuntimeError: double_faulty: boom",
    1: "attempt 2 timed out after 2s",
    2: "logprobs for",
    3: "reward is nan",
    4: "empty response_ids",
}


def test_each_workflow_fault_fails_its_task_with_a_message_and_writes_nothing(engines, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "faulty.py").write_text(FAULTY)
    overrides = [
        *BASE,
        "buffer.total_steps=1",
        "buffer.batch_size=8",
        "buffer.explorer_input.taskset.default_workflow_type=double_faulty",
        "explorer.max_timeout=2",
        "explorer.max_retry_times=1",
    ]
    cfg = load_config(None, overrides)
    cfg.plugin_dirs = [plugins]
    summary = explore(cfg, tmp_path / "run", progress=False, engines=engines)

    assert summary.failed_tasks == len(EXPECTED)
    table = pq.read_table(summary.run_dir / "experiences")
    assert sorted(set(table.column("task_uid").to_pylist())) == [f"arith/e0/{i}" for i in (5, 6, 7)]
    assert table.num_rows == 3 * 2

    client = MlflowClient(summary.tracking_uri)
    (failed,) = client.get_metric_history(summary.mlflow_run_id, "rollout/failed_tasks")
    assert failed.value == len(EXPECTED)
    local = client.download_artifacts(summary.mlflow_run_id, "failures/step_000001.json", str(tmp_path))
    failures = json.loads(Path(local).read_text())
    rows = dict(zip(failures["columns"], zip(*failures["data"], strict=True), strict=True))
    messages = dict(zip(rows["task_uid"], rows["message"], strict=True))
    assert sorted(messages) == [f"arith/e0/{i}" for i in EXPECTED]
    for index, fragment in EXPECTED.items():
        assert fragment in messages[f"arith/e0/{index}"]
    assert set(rows["attempts"]) == {2}  # each fault was retried once, on a fresh instance, then failed
