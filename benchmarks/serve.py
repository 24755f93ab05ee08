"""Serve mode's front against the engine's own endpoint, same sessions, same engine, in one run:

- direct: each session calls the engine's OpenAI endpoint itself, under an engine session of its own (the
  engine records it the same way);
- serve: each session opens a front session, calls through the front (which stores every call durably before
  answering) and rewards each call.

Each side runs `--sessions` concurrent sessions of `--calls` chat calls (seeded, `--max-tokens` each), the
sides alternating for `--rounds` rounds. The sessions' clients run in a process of their own, for both
sides (as real users do), so the front, which runs in this process, shares it with no client.

Reported: calls/s and tokens/s per side, the ratio serve / direct, and the front's added latency: the
p50/p99 of (front response time - engine time for the same request), measured inside the front, and
cross-checked against the mean end-to-end latency difference of the two sides. Targets at 113M
(`make_random_model.py`), 32 sessions: ratio >= 0.85 and p99 added latency <= 20 ms.

    python benchmarks/serve.py [--model DIR] [--sessions 32] [--calls 4] [--max-tokens 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from common import bench_config, parser, start_fleet


def parse_args() -> argparse.Namespace:
    options = parser(__doc__, model=None, max_tokens=(16, "max sampled tokens per call"))
    options.add_argument("--sessions", type=int, default=32, help="concurrent sessions per side")
    options.add_argument("--calls", type=int, default=4, help="chat calls per session")
    options.add_argument("--rounds", type=int, default=2, help="rounds, each running both sides in turn")
    return options.parse_args()


def body(model: str, session: int, turn: int, max_tokens: int) -> dict:
    prompt = f"{session % 50}+{turn + 3}="
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": session * 100 + turn,
        "ignore_eos": True,
    }


async def timed(session, sessions: int) -> tuple[int, float]:
    """`sessions` of `session(i, http)` at once on one client: their tokens, and the seconds they took."""
    import httpx

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=sessions * 2)) as http:
        started = time.perf_counter()
        counts = await asyncio.gather(*(session(i, http) for i in range(sessions)))
        return sum(counts), time.perf_counter() - started


async def direct_side(url: str, keys: list[str], model: str, args) -> tuple[int, float, list[float]]:
    """Sessions straight to the engine, each under its own engine session; (tokens, seconds, latencies)."""

    latencies: list[float] = []

    async def session(i: int, http) -> int:
        headers = {"Authorization": f"Bearer {keys[i]}"}
        tokens = 0
        for turn in range(args.calls):
            sent = time.perf_counter()
            answer = await http.post(
                f"{url}/chat/completions", json=body(model, i, turn, args.max_tokens), headers=headers
            )
            latencies.append(time.perf_counter() - sent)
            tokens += answer.raise_for_status().json()["usage"]["completion_tokens"]
        return tokens

    tokens, seconds = await timed(session, args.sessions)
    return tokens, seconds, latencies


async def serve_side(front_url: str, model: str, args) -> tuple[int, float, list[float]]:

    latencies: list[float] = []

    async def session(i: int, http) -> int:
        opened = (await http.post(f"{front_url}/sessions")).raise_for_status().json()
        headers = {"Authorization": f"Bearer {opened['api_key']}"}
        tokens = 0
        for turn in range(args.calls):
            sent = time.perf_counter()
            answer = await http.post(
                f"{front_url}/v1/chat/completions",
                json=body(model, i, turn, args.max_tokens),
                headers=headers,
            )
            latencies.append(time.perf_counter() - sent)
            reply = answer.raise_for_status().json()
            tokens += reply["usage"]["completion_tokens"]
            await http.post(
                f"{front_url}/sessions/{opened['session_id']}/reward",
                json={"reward": 1.0, "call_id": reply["id"]},
            )
        await http.post(f"{front_url}/sessions/{opened['session_id']}/end")
        return tokens

    tokens, seconds = await timed(session, args.sessions)
    return tokens, seconds, latencies


def client_main(spec: dict) -> None:
    """The clients' process: one side's sessions, its figures as JSON on stdout."""
    args = argparse.Namespace(**spec["args"])
    if spec["side"] == "direct":
        result = asyncio.run(direct_side(spec["url"], spec["keys"], spec["model"], args))
    else:
        result = asyncio.run(serve_side(spec["url"], spec["model"], args))
    print(json.dumps(result))


async def in_client_process(spec: dict) -> tuple[int, float, list[float]]:
    """One side's sessions in a process of their own (started from a thread: asyncio's child watcher would
    also reap the processes Ray started from this one)."""
    command = [sys.executable, __file__, "--client", json.dumps(spec)]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {spec['side']} clients failed ({done.returncode}): {done.stderr[-2000:]}")
    tokens, seconds, latencies = json.loads(done.stdout.strip().splitlines()[-1])
    return tokens, seconds, latencies


async def run(args) -> dict:
    import httpx

    from pipelines.serving.service import Service

    cfg = bench_config(
        args,
        "mode=serve",
        "serve.port=0",
        f"serve.max_concurrent={args.sessions * 2}",
        "explorer.rollout_model.enable_openai_api=true",
    )
    fleet = await asyncio.to_thread(start_fleet, cfg, "bench-serve")
    service = None
    try:
        handle = fleet.handles[0]
        url, model, _ = await handle.openai_endpoint.remote()
        with tempfile.TemporaryDirectory() as tmp:
            service = Service(cfg, Path(tmp), fleet=fleet)
            front = (await service.start()).url
            shared = {"sessions": args.sessions, "calls": args.calls, "max_tokens": args.max_tokens}
            opened = [
                handle.open_session.remote(2**31 - 1, 2**31 - 1, 300.0, None, ["bench", i])
                for i in range(args.sessions)
            ]
            keys = [await key for key in opened]
            warm = {
                "side": "direct",
                "url": url,
                "keys": keys,
                "model": model,
                "args": {**shared, "sessions": 4, "calls": 1},
            }
            await in_client_process(warm)
            sides = {"direct": [0, 0.0, []], "serve": [0, 0.0, []]}
            for _ in range(args.rounds):
                for name in ("direct", "serve"):
                    target = url if name == "direct" else front
                    spec = {"side": name, "url": target, "keys": keys, "model": model, "args": shared}
                    tokens, seconds, lat = await in_client_process(spec)
                    sides[name][0] += tokens
                    sides[name][1] += seconds
                    sides[name][2] += lat
            async with httpx.AsyncClient(base_url=front, timeout=60) as http:
                figures = (await http.get("/metrics")).json()
                committed = (await http.post("/commit")).json()
    except BaseException:
        traceback.print_exc()  # now: Ray's shutdown of a failed run can end the process before Python prints
        raise
    finally:
        if service is not None:
            await service.stop()
        await asyncio.to_thread(fleet.stop)
    calls = args.sessions * args.calls * args.rounds
    rate = {name: tokens / seconds for name, (tokens, seconds, _) in sides.items()}
    mean_ms = {name: 1000 * statistics.mean(lat) for name, (_, _, lat) in sides.items()}
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "model": str(cfg.model.model_path),
        "sessions": args.sessions,
        "calls_per_side": calls,
        "tokens": {name: tokens for name, (tokens, _, _) in sides.items()},
        "seconds": {name: round(seconds, 2) for name, (_, seconds, _) in sides.items()},
        "tokens_per_s": {name: round(value, 1) for name, value in rate.items()},
        "calls_per_s": {name: round(calls / seconds, 2) for name, (_, seconds, _) in sides.items()},
        "mean_latency_ms": {name: round(value, 1) for name, value in mean_ms.items()},
        "added_latency_ms_inside_front": {
            "p50": round(figures["serve/added_latency_ms/p50"], 2),
            "p99": round(figures["serve/added_latency_ms/p99"], 2),
        },
        "added_latency_ms_end_to_end_mean": round(mean_ms["serve"] - mean_ms["direct"], 2),
        "committed_experiences": committed["experiences"],
        "ratio": rate["serve"] / rate["direct"],
    }


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        client_main(json.loads(sys.argv[2]))
        return
    args = parse_args()
    report = asyncio.run(run(args))
    print(json.dumps({k: v for k, v in report.items() if k != "ratio"}, indent=2))
    p99 = report["added_latency_ms_inside_front"]["p99"]
    print(f"serve added latency: p99={p99:.1f} ms (target <= 20)")
    print(f"serve: ratio={report['ratio']:.2f} (target >= 0.85)")


if __name__ == "__main__":
    main()
