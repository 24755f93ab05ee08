"""A real S3-compatible server for the object-store tests: moto in server mode (`moto[server]`), started on
127.0.0.1 on a free port, and the run-dir URIs that point at it.

The credentials are dummies (moto checks none) and go in the URI, so Ray workers started before the tests
(the shared engine fixture's) open the same store without any environment of their own.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass

import pyarrow.fs as pafs
from local_servers import end, free_port, port_open, wait_up

START_TIMEOUT_S = 30.0
REGION = "us-east-1"
ACCESS_KEY, SECRET_KEY = "rftflow-test", "rftflow-test-secret"


@dataclass
class S3Server:
    process: subprocess.Popen
    port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def filesystem(self) -> pafs.S3FileSystem:
        """A client of the server (it may create buckets, which a run never does)."""
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=self.endpoint,
            scheme="http",
            region=REGION,
            allow_bucket_creation=True,
        )

    def new_bucket(self) -> str:
        name = f"rftflow-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def uri(self, bucket: str, prefix: str) -> str:
        """A run-dir URI on `bucket`, as a user would give it to --run-dir."""
        query = f"endpoint_override={self.endpoint}&scheme=http&region={REGION}"
        return f"s3://{ACCESS_KEY}:{SECRET_KEY}@{bucket}/{prefix}?{query}"

    def stop(self) -> None:
        end(self.process)


def start_s3_server() -> S3Server:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = S3Server(process, port)
    try:
        wait_up("moto server", process, lambda: port_open(port), START_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server
