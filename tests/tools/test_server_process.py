"""The test and benchmark servers' port choice (sglang_ssd/tools/server_process.py)."""

from __future__ import annotations

import socket

from sglang_ssd.tools.server_process import free_port


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    for _ in range(20):
        port = free_port()
        assert 10000 <= port < min(22000, _ephemeral_low())
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_a_taken_range_falls_back_to_an_ephemeral_port():
    busy = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", busy))
        port = free_port(low=busy, high=busy)  # the only candidate is taken
        assert port != busy and port >= _ephemeral_low()
