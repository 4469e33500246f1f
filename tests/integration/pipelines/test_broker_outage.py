"""Sink pipelines riding out broker outages on real parts (issue 17): the broker process
SIGKILLed mid-round and started again ~5 s later (durable S3 log, same port), and the
network to it cut (connections reset, new ones refused) or stalled (black hole) for ~10 s
through a TCP proxy.

Each asserts exactly once (row set, no duplicates, committed offsets) and that the pipeline
catches up on records produced after the outage - no stuck round, no stuck split - and
prints how long after the broker was reachable again records produced then were committed.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.tcp_proxy import TcpProxy
from sink_checks import Produced, assert_exactly_once, caught_up, open_round_with_data, pipeline

import rayconnect as rc
from rayconnect.kafka.embedded import EmbeddedBroker

_SETTINGS: dict[str, Any] = {"commit_interval_s": 2, "write_timeout_s": 30}


def _outage(
    name: str,
    bootstrap: str,
    table: Path,
    break_it: Callable[[], None],
    mend_it: Callable[[], None],
    down_s: float,
) -> None:
    produced = Produced(bootstrap, name, 3)
    produced.more(3000)
    handle: rc.PipelineHandle = pipeline(name, bootstrap, name, table, **_SETTINGS).start()
    try:
        handle.wait_for(caught_up(produced), timeout_s=120)
        produced.more(3000)
        handle.wait_for(open_round_with_data, timeout_s=60, poll_s=0.05)
        break_it()
        broken_at = time.monotonic()
        during = [handle.status() for _ in _every(1.0, until=broken_at + down_s)]
        mend_it()
        back_at = time.monotonic()
        # What was read before the outage may commit during it (a commit needs the table,
        # not the broker): recovery is records produced after it, read and committed.
        produced.more(2000)
        produced_s = time.monotonic() - back_at
        status = handle.wait_for(caught_up(produced), timeout_s=180, poll_s=0.1)
        caught_up_s = time.monotonic() - back_at
        assert_exactly_once(table, produced, status)
        assert status["error"] is None
        # the outage showed in status while it lasted, and cleared by itself
        shown = [r["broker"] for s in during for r in s["readers"].values() if r.get("broker")]
        assert shown, "no reader status said the broker was unreachable"
        status = handle.wait_for(_broker_fine, timeout_s=60)
        discarded = status["rounds_discarded"] - during[0]["rounds_discarded"]
        print(
            f"\n{name}: down {back_at - broken_at:.1f} s; after it was back: 2000 more "
            f"produced in {produced_s:.1f} s, all {sum(produced.counts.values())} records "
            f"committed {caught_up_s:.1f} s after; rounds discarded {discarded}; "
            f"status said e.g. {shown[-1]!r}"
        )
    finally:
        handle.stop(commit=False)


def _broker_fine(status: dict[str, Any]) -> bool:
    return all(r.get("broker_unreachable_since") is None for r in status["readers"].values())


def _every(period_s: float, until: float) -> Iterator[None]:
    while time.monotonic() < until:
        yield
        time.sleep(max(0.0, min(period_s, until - time.monotonic())))


@pytest.mark.timeout(420)
def test_sink_through_a_broker_sigkill_and_restart(
    ray_session, durable_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    def kill() -> None:
        pid = durable_broker.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    _outage(
        "brokerkill",
        durable_broker.bootstrap_servers,
        tmp_path / "t",
        kill,
        durable_broker.start,
        down_s=5,
    )


@pytest.fixture
def proxied_broker(tmp_path: Path) -> Iterator[tuple[EmbeddedBroker, TcpProxy]]:
    """A broker that clients reach only through a proxy (it advertises the proxy's port)."""
    with TcpProxy() as proxy:
        broker = EmbeddedBroker("local", tmp_path / "kafka", advertised_port=proxy.port)
        with broker:
            proxy.target_port = broker.port
            yield broker, proxy


@pytest.mark.timeout(420)
def test_sink_through_a_network_cut(
    ray_session, proxied_broker: tuple[EmbeddedBroker, TcpProxy], tmp_path: Path
) -> None:
    _, proxy = proxied_broker
    _outage(
        "netcut",
        f"127.0.0.1:{proxy.port}",
        tmp_path / "t",
        proxy.cut,
        proxy.forward,
        down_s=10,
    )


@pytest.mark.timeout(420)
def test_sink_through_a_network_stall(
    ray_session, proxied_broker: tuple[EmbeddedBroker, TcpProxy], tmp_path: Path
) -> None:
    """Black hole: connections stay open but no byte moves for 10 s (no error at once)."""
    _, proxy = proxied_broker
    _outage(
        "netstall",
        f"127.0.0.1:{proxy.port}",
        tmp_path / "t",
        proxy.black_hole,
        proxy.forward,
        down_s=10,
    )
