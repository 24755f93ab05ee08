"""`python -m pipelines.serve`: learn from live traffic. One OpenAI-compatible endpoint before the engines;
callers open sessions, call the model with the session's key, send rewards; what is rewarded is committed as
steps for a trainer, exactly once (docs/serving.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from pathlib import Path

from pipelines.cli import add_config_arguments, given_path, logging_to_console, run_cli
from pipelines.control.console import console_defaults
from schemas.config import Config, load_config

log = logging.getLogger(__name__)

EPILOG = """\
how to call it (the front prints its address):
  curl -X POST http://127.0.0.1:8010/sessions                  -> {"session_id": S, "api_key": K}
  an OpenAI client with base_url=http://127.0.0.1:8010/v1 and api_key=K: chat completions, responses,
    completions, messages (streaming too); a call's id is the response's `id`
  curl -X POST http://127.0.0.1:8010/sessions/S/reward -d '{"reward": 1.0}'   (the last call; or "call_id")
  curl -X POST http://127.0.0.1:8010/sessions/S/end
  curl -X POST http://127.0.0.1:8010/commit        -> the rewarded, ended sessions as the next step
  Trinity-RFT's client works unchanged: api_key="EMPTY" calls, /feedback, /commit, /metrics, /health

examples:
  python -m pipelines.serve                        # the bundled tiny model on 127.0.0.1:8010
  python -m pipelines.serve --config my.yaml --set serve.commit_every_sessions=32
  python -m pipelines.serve --run-dir runs/serve-X # restart: nothing acknowledged is lost

outputs (under --run-dir):
  serve.db                          served calls, rewards and commits (serve.db_url for another database)
  experiences/step_NNNNNN/*.parquet committed steps, for a trainer
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.serve",
        description="Serve the engines behind one OpenAI-compatible endpoint, record every call, take "
        "rewards as feedback, and commit what was rewarded as training steps, exactly once.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument("--run-dir", type=given_path, help="where outputs go; an existing one is resumed")
    parser.add_argument("--host", help="address to listen on (serve.host; other than 127.0.0.1 needs a key)")
    parser.add_argument("--port", type=int, help="port (serve.port; 0: a free one)")
    parser.add_argument("--ray-address", help="join a running Ray cluster, e.g. 'auto'")
    parser.add_argument(
        "--with-trainer",
        action="store_true",
        help="run the reference GRPO trainer beside the front: one update per committed step, each new "
        "checkpoint rolled out engine by engine",
    )
    parser.add_argument("--trainer-lr", type=float, help="the reference trainer's learning rate")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, with tracebacks")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> Config:
    overrides = list(args.overrides)
    if args.host is not None:
        overrides.append(f"serve.host={args.host}")
    if args.port is not None:
        overrides.append(f"serve.port={args.port}")
    cfg = load_config(
        args.config, [*overrides, "explorer.rollout_model.enable_openai_api=true", "mode=serve"]
    )
    return cfg


async def serve(cfg: Config, run_dir: Path, args: argparse.Namespace) -> None:
    from pipelines.serving.service import Service  # heavy (Ray, uvicorn), deferred: --help answers at once

    service = Service(cfg, run_dir, with_trainer=args.with_trainer, trainer_lr=args.trainer_lr)
    ray_address = args.ray_address
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        started = await service.start(ray_address)
        if started.interrupted:
            count = len(started.interrupted)
            print(f"{count} session(s) left open by the last front were ended; their keys no longer work")
        if started.recovered:
            print(f"finished the commit(s) of step(s) {started.recovered} that a stop had cut")
        print(f"rftflow serve: listening on {started.url}  (OpenAI base_url {started.url}/v1)")
        print(f"  open a session:  curl -X POST {started.url}/sessions")
        print(f"  run dir:         {run_dir}   (Ctrl-C stops; restart with --run-dir {run_dir})")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await service.stop()


def run_command(args: argparse.Namespace) -> int:
    with logging_to_console(args.verbose):
        cfg = build_config(args)
        run_dir = args.run_dir or Path("runs") / f"serve-{time.strftime('%Y%m%d-%H%M%S')}"
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(cfg, Path(run_dir), args))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console_defaults(args.verbose)
    return run_cli(lambda: run_command(args), args.verbose)


if __name__ == "__main__":
    sys.exit(main())
