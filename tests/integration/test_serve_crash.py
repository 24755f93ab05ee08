"""Serve mode against SIGKILL: a front in its own process (tests/serve_scripts/front_process.py, before the
session's engine actor) is killed between feedback and commit, and again in the middle of a commit; a front
restarted on the same run dir (in this process) loses no acknowledged call or reward, finishes the cut commit,
and writes every experience exactly once, equal to what the user was answered, with its reward."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import ray
from integration_settings import BASE

from operators.sinks.parquet import ParquetSink
from pipelines.serving.service import Service
from schemas.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "serve_scripts" / "front_process.py"
SHOWN = {"logprobs": True, "return_token_ids": True}


def start_front(engines, run_dir: Path, hold: Path | None = None) -> tuple[subprocess.Popen, str]:
    url_file = run_dir.parent / f"{run_dir.name}.url"
    url_file.unlink(missing_ok=True)
    command = [sys.executable, str(SCRIPT), "--ray-address", ray.get_runtime_context().gcs_address]
    command += ["--engine", engines.names[0], "--run-dir", str(run_dir), "--url-file", str(url_file)]
    command += [arg for setting in BASE for arg in ("--set", setting)]
    if hold is not None:
        command += ["--hold-commit", str(hold)]
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    deadline = time.monotonic() + 90
    while not url_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(
                f"the front did not start: {(run_dir.parent / f'{run_dir.name}.log').read_text()[-3000:]}"
            )
        time.sleep(0.2)
    return process, url_file.read_text()


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


async def served_and_rewarded(url: str) -> list[dict]:
    """Two sessions of two calls each, every call rewarded and acknowledged, the sessions ended."""
    seen = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for s in range(2):
            opened = (await http.post("/sessions")).raise_for_status().json()
            headers = {"Authorization": f"Bearer {opened['api_key']}"}
            messages = [{"role": "user", "content": f"{s}+7="}]
            for turn in range(2):
                body = {
                    "model": "tiny-arith-llama",
                    "messages": messages,
                    "max_tokens": 5,
                    "seed": turn,
                    **SHOWN,
                }
                answer = (
                    (await http.post("/v1/chat/completions", json=body, headers=headers))
                    .raise_for_status()
                    .json()
                )
                choice = answer["choices"][0]
                reward = {"reward": 0.5 * s + 0.25 * turn, "call_id": answer["id"]}
                (await http.post(f"/sessions/{opened['session_id']}/reward", json=reward)).raise_for_status()
                key = (f"serve/{opened['session_id']}", turn)
                seen.append(
                    {
                        "key": key,
                        "prompt": answer["prompt_token_ids"],
                        "ids": choice["token_ids"],
                        "reward": reward["reward"],
                    }
                )
                messages += [
                    {"role": "assistant", "content": choice["message"]["content"]},
                    {"role": "user", "content": "go on"},
                ]
            (await http.post(f"/sessions/{opened['session_id']}/end")).raise_for_status()
    return seen


def check_committed_once(run_dir: Path, seen: list[dict]) -> None:
    sink = ParquetSink(run_dir / "experiences")
    rows = [r for step in sink.committed_steps() for r in sink.read_step(step).to_pylist()]
    keys = [(r["task_uid"], r["run_id"]) for r in rows]
    assert sorted(keys) == sorted(s["key"] for s in seen)  # each acknowledged call once, nothing else
    by_key = {(r["task_uid"], r["run_id"]): r for r in rows}
    for s in seen:
        row = by_key[s["key"]]
        assert (row["prompt_ids"], row["response_ids"], row["reward"]) == (s["prompt"], s["ids"], s["reward"])


def restart_and_commit(loop, engines, run_dir: Path) -> tuple[list[int], dict]:
    cfg = load_config(None, [*BASE, "mode=serve", "serve.port=0"])
    service = Service(cfg, run_dir, fleet=engines)

    async def go() -> tuple[list[int], dict]:
        started = await service.start()
        async with httpx.AsyncClient(base_url=started.url, timeout=60) as http:
            committed = (await http.post("/commit")).json()
        return started.recovered, committed

    try:
        return loop.run_until_complete(asyncio.wait_for(go(), 120))
    finally:
        loop.run_until_complete(service.stop())


@pytest.mark.parametrize("moment", ["between feedback and commit", "during a commit"])
def test_a_front_killed_then_restarted_loses_nothing_acknowledged_and_writes_nothing_twice(
    loop, engines, tmp_path, moment
):
    run_dir = tmp_path / "run"
    hold = tmp_path / "commit-held" if moment == "during a commit" else None
    process, url = start_front(engines, run_dir, hold)
    try:
        seen = loop.run_until_complete(asyncio.wait_for(served_and_rewarded(url), 120))
        if hold is not None:
            commit = subprocess.Popen(
                [sys.executable, "-c", f"import httpx; httpx.post('{url}/commit', timeout=600)"]
            )
            deadline = time.monotonic() + 60
            while not hold.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert hold.exists(), "the commit never reached the sink"
        kill(process)
        if hold is not None:
            commit.kill()
            commit.wait()
    finally:
        if process.poll() is None:
            kill(process)
    recovered, committed = restart_and_commit(loop, engines, run_dir)
    if hold is not None:
        assert recovered == [1] and committed["step"] is None  # the cut commit was finished, once
    else:
        assert recovered == [] and committed["step"] == 1 and committed["experiences"] == 4
    check_committed_once(run_dir, seen)
