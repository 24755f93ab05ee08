"""The loopback guard the framework tests run under refuses what leaves this machine and lets loopback be."""

from __future__ import annotations

import socket

import pytest
from loopback_guard import GUARD, is_loopback


def test_loopback_names_and_addresses_pass_and_others_do_not():
    local = ["127.0.0.1", "127.3.2.1", "::1", "localhost", b"127.0.0.1", None, "0.0.0.0"]
    assert all(map(is_loopback, local))
    assert not any(map(is_loopback, ["192.0.2.1", "2001:db8::1", "api.openai.com", "10.0.0.1"]))


def test_a_connection_off_the_machine_is_refused_and_kept_while_loopback_connects():
    with socket.create_server(("127.0.0.1", 0)) as server, GUARD.watching() as guard:
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
        with socket.socket() as sock, pytest.raises(PermissionError, match="192.0.2.1"):
            sock.connect(("192.0.2.1", 443))  # TEST-NET-1: refused before any packet leaves
        with pytest.raises(PermissionError, match="api.openai.com"):
            socket.getaddrinfo("api.openai.com", 443)
        assert guard.refused == ["socket.connect 192.0.2.1", "socket.getaddrinfo api.openai.com"]
    assert not GUARD.on
