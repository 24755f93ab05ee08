"""A serving front in its own process, for the crash tests (tests/integration/test_serve_crash.py): it joins
the test's Ray cluster, serves before the engine actors the test session started (looked up by name), and
writes its address to a file. `--hold-commit FILE` is the test's fault injection: a commit, once planned,
touches FILE and waits, so that the test can SIGKILL the process mid-commit."""

import argparse
import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

import ray

from operators.actors.names import NAMESPACE, find_actor
from pipelines.serving import commits
from pipelines.serving.service import Service
from schemas.config import load_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ray-address", required=True)
    parser.add_argument("--engine", required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--url-file", type=Path, required=True)
    parser.add_argument("--hold-commit", type=Path)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    ray.init(address=args.ray_address, namespace=NAMESPACE, logging_level="ERROR")
    if args.hold_commit is not None:
        write = commits.Committer.write

        def held(self, step, calls):
            args.hold_commit.touch()
            time.sleep(600)  # killed here
            return write(self, step, calls)

        commits.Committer.write = held
    cfg = load_config(None, [*args.overrides, "mode=serve", "serve.port=0"])
    fleet = SimpleNamespace(handles=[find_actor(args.engine)])

    async def serve() -> None:
        service = Service(cfg, args.run_dir, fleet=fleet)
        started = await service.start()
        args.url_file.write_text(started.url)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
