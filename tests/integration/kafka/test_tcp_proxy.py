"""The outage tests' TCP proxy, in front of a real broker: each mode does what it says."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
from fixtures.tcp_proxy import TcpProxy

from rayconnect.kafka.embedded import EmbeddedBroker, _api_versions_ok


def _wait(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.timeout(60)
def test_forward_cut_black_hole_and_back(kafka_broker: EmbeddedBroker) -> None:
    with TcpProxy(kafka_broker.port) as proxy:
        assert _api_versions_ok("127.0.0.1", proxy.port)
        held = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        held.settimeout(5)
        assert _wait(lambda: (proxy.connections_accepted, proxy.open_connections) == (2, 2))

        assert proxy.cut() == 2
        with pytest.raises(ConnectionResetError):
            held.recv(1)
        assert not _api_versions_ok("127.0.0.1", proxy.port)  # new ones refused

        proxy.black_hole()  # accepted, but no answer ever comes
        assert not _api_versions_ok("127.0.0.1", proxy.port, timeout=1.0)

        proxy.forward()
        assert _api_versions_ok("127.0.0.1", proxy.port)
        held.close()
