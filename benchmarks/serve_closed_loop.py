"""Serve mode's closed loop: a scripted user talks to the front, rewards the answers it likes, and
commits; the reference trainer (`--with-trainer`) trains on each committed step, and its checkpoints are
rolled out to the engine while the user keeps talking.

The user likes answers that use the calculator: it asks the bundled tool model (`tiny-tool-llama`, with the
`tool_math` system prompt) `tool_arith` questions, and rewards a reply 1 when it calls `<calc>`, else 0. Each
step is `--sessions` sessions of `--calls` calls on one question each at temperature 1 (one session's calls
form one GRPO group), all rewarded, the sessions ended, then `/commit`. Target, seed 0: the mean reward of the
last 5 committed steps at least the first 5's + 0.20, within 10 minutes on 2 cores (engine start included).

    python benchmarks/serve_closed_loop.py [--steps 40] [--sessions 8] [--calls 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from common import first_tasks

TOOL_CONFIG = Path(__file__).resolve().parents[1] / "pipelines" / "demo_tool.yaml"


def parse_args() -> argparse.Namespace:
    options = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--steps", type=int, default=40, help="committed steps")
    options.add_argument("--sessions", type=int, default=8, help="sessions (questions) per step")
    options.add_argument("--calls", type=int, default=4, help="calls per session (one GRPO group)")
    options.add_argument("--lr", type=float, default=None, help="the trainer's learning rate")
    return options.parse_args()


async def step(http, url: str, model: str, system: str, questions: list[str], calls: int, seed: int) -> float:
    """One step's sessions, every call rewarded; the mean reward."""

    async def session(index: int, question: str) -> list[float]:
        opened = (await http.post(f"{url}/sessions")).raise_for_status().json()
        headers = {"Authorization": f"Bearer {opened['api_key']}"}
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        rewards = []
        for call in range(calls):
            body = {"model": model, "messages": messages, "max_tokens": 24, "temperature": 1.0}
            body["seed"] = seed * 100_000 + index * 100 + call
            reply = (
                (await http.post(f"{url}/v1/chat/completions", json=body, headers=headers))
                .raise_for_status()
                .json()
            )
            liked = float("<calc>" in (reply["choices"][0]["message"]["content"] or ""))
            reward = {"reward": liked, "call_id": reply["id"]}
            (await http.post(f"{url}/sessions/{opened['session_id']}/reward", json=reward)).raise_for_status()
            rewards.append(liked)
        (await http.post(f"{url}/sessions/{opened['session_id']}/end")).raise_for_status()
        return rewards

    results = await asyncio.gather(*(session(i, q) for i, q in enumerate(questions)))
    (await http.post(f"{url}/commit")).raise_for_status()
    return statistics.mean(r for rewards in results for r in rewards)


async def run(args: argparse.Namespace) -> dict:
    import httpx

    from operators.workflows.tool_math import TOOL_SYSTEM_PROMPT
    from pipelines.serving.service import Service
    from schemas.config import load_config

    started = time.monotonic()
    cfg = load_config(TOOL_CONFIG, ["mode=serve", "serve.port=0", "serve.health_check_interval_s=0.5"])
    cfg.explorer.rollout_model.enable_openai_api = True
    tasks = first_tasks(cfg, args.steps * args.sessions)
    with tempfile.TemporaryDirectory() as tmp:
        service = Service(cfg, Path(tmp), with_trainer=True, trainer_lr=args.lr)
        try:
            url = (await service.start()).url
            model = service.front.pool.model
            means, versions = [], []
            async with httpx.AsyncClient(timeout=300) as http:
                for s in range(args.steps):
                    questions = [t.prompt for t in tasks[s * args.sessions : (s + 1) * args.sessions]]
                    means.append(await step(http, url, model, TOOL_SYSTEM_PROMPT, questions, args.calls, s))
                    versions.append(service.fleet.version)
                    print(
                        f"step {s + 1}: mean reward {means[-1]:.3f}, engine version {versions[-1]}",
                        flush=True,
                    )
        finally:
            await service.stop()
    first, last = statistics.mean(means[:5]), statistics.mean(means[-5:])
    return {"means": [round(m, 3) for m in means], "versions": versions, "first5": first, "last5": last,
            "rise": last - first, "seconds": round(time.monotonic() - started, 1)}  # fmt: skip


def main() -> None:
    report = asyncio.run(run(parse_args()))
    print(json.dumps(report))
    first, last = report["first5"], report["last5"]
    print(f"first 5 steps {first:.3f}, last 5 {last:.3f}, {report['seconds']:.0f} s in all")
    print(f"serve_closed_loop: rise={report['rise']:.2f} (target >= 0.20)")


if __name__ == "__main__":
    main()
