"""A guard that proves code under test makes no request off this machine: an audit hook on `socket.connect`
(and on `socket.getaddrinfo`, a name looked up to be reached) refuses any address that is not loopback.

Audit hooks cannot be removed, so one hook is installed for the process and a `LoopbackGuard` is switched on
and off around the code it watches. While on, a connection elsewhere raises `PermissionError` in the caller
(a framework that swallows it, in a telemetry thread say, still fails the test: each refusal is kept in
`refused`). Unix sockets are local by nature and allowed.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: Any) -> bool:
    """A loopback address or name; `None` and the unspecified address (a lookup to bind, or 0.0.0.0 itself)
    stay on this machine too."""
    if host is None:
        return True
    if isinstance(host, bytes):
        host = host.decode()
    if host in LOCAL_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


@dataclass
class LoopbackGuard:
    """Refuses, while `on`, every connection or lookup of an address that is not loopback."""

    on: bool = False
    refused: list[str] = field(default_factory=list)

    def audit(self, event: str, args: tuple) -> None:
        if not self.on:
            return
        if event == "socket.connect":
            sock, address = args
            host = address[0] if sock.family in (socket.AF_INET, socket.AF_INET6) else None
        elif event == "socket.getaddrinfo":
            host = args[0]
        else:
            return
        if not is_loopback(host):
            self.refused.append(f"{event} {host}")
            raise PermissionError(f"loopback guard: {event} to {host!r} refused (tests stay on this machine)")

    @contextmanager
    def watching(self) -> Iterator[LoopbackGuard]:
        """Switched on for the block; `refused` starts empty."""
        self.refused.clear()
        self.on = True
        try:
            yield self
        finally:
            self.on = False


GUARD = LoopbackGuard()
sys.addaudithook(GUARD.audit)
