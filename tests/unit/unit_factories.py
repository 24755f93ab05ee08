"""Factories shared by the unit tests: experiences, per-task result rows, taskset records, a scripted engine.

Plain Python + pyarrow only: no Ray, no vLLM. Named distinctively so it cannot clash with other test dirs.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from operators.sinks.parquet import write_fragments
from schemas.experience import Experience
from schemas.status import Status, result_row, results_to_table


def make_experience(task_uid: str = "t/e0/0", run_id: int = 0, **overrides: Any) -> Experience:
    """A valid experience; `n_tokens` sets the response length, other keywords override fields."""
    n = overrides.pop("n_tokens", 3)
    fields: dict[str, Any] = {
        "task_uid": task_uid,
        "run_id": run_id,
        "step": 1,
        "taskset": "t",
        "model_version": 0,
        "prompt_ids": [1, 2],
        "response_ids": list(range(10, 10 + n)),
        "logprobs": [-0.5] * n,
        "reward": 1.0,
        "response_text": "<answer>1</answer>",
        "truth": "1",
        "finish_reason": "stop",
        "reward_parts": {"accuracy": 1.0},
    }
    fields.update(overrides)
    return Experience(**fields)


def make_result(
    task_uid: str,
    step: int = 1,
    n_experiences: int = 2,
    ok: bool = True,
    message: str | None = None,
    run_id_base: int = 0,
    model_version: int = 0,
) -> dict[str, Any]:
    """One sub-run's result row as the rollout operator emits it, with runs `run_id_base ..` of the task."""
    runs = range(run_id_base, run_id_base + n_experiences)
    experiences = [make_experience(task_uid, run, step=step, model_version=model_version) for run in runs]
    return result_row(
        task_uid=task_uid,
        taskset="t",
        step=step,
        is_eval=False,
        run_id_base=run_id_base,
        repeat_times=max(n_experiences, 1),
        status=Status(ok=ok, message=message),
        task_run_time=0.25,
        experiences=experiences,
    )


def make_results(spec: list[tuple[Any, ...]]) -> pa.Table:
    """A result table from (task_uid, step, n_experiences[, run_id_base]); no experiences means failed."""
    rows = []
    for uid, step, n, *base in spec:
        run_id_base = base[0] if base else 0
        rows.append(
            make_result(uid, step, n, ok=n > 0, message=None if n else "boom", run_id_base=run_id_base)
        )
    return results_to_table(rows)


def fragments_of(records: pa.Table, step: int | None = None) -> set[str]:
    """The fragment names that writer records report (for `step`, or all)."""
    return {
        r["fragment"] for r in records.to_pylist() if r["fragment"] and (step is None or r["step"] == step)
    }


def write_and_commit(sink: Any, spec: list[tuple[Any, ...]]) -> pa.Table:
    """Write the results of `spec` (as `make_results`) under the sink's root and commit each step."""
    records = write_fragments(make_results(spec), str(sink.root))
    for step in sorted(set(records.column("step").to_pylist())):
        sink.commit_step(step, fragments_of(records, step))
    return records


def qa_rows(n: int, start: int = 0) -> list[dict[str, str]]:
    """n simple prompt/answer records."""
    return [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(start, start + n)]


class ScriptedEngine:
    """A local engine whose chat answers each request with `n` scripted texts, one token per character."""

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.requests: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    async def chat(self, messages: list[dict[str, str]], sampling: dict[str, Any]) -> dict[str, Any]:
        self.requests.append((messages, sampling))
        texts = [self.texts[i % len(self.texts)] for i in range(sampling["n"])]
        samples = [
            {
                "response_ids": [ord(c) for c in t],
                "logprobs": [-0.1] * len(t),
                "finish_reason": "stop",
                "text": t,
            }
            for t in texts
        ]
        return {"prompt_ids": [1, 2, 3], "prompt_text": str(messages), "model_version": 7, "samples": samples}

    async def generate(self, prompt: Any, sampling: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError  # EngineClient looks for it; single-turn workflows only chat
