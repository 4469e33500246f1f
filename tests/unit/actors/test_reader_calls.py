"""ReaderCalls: one steering call in flight per reader, the rest batched behind it, in order.

The reader here is a stand-in with the actor's ``steer.remote`` shape (the queueing is
what is under test; the real reader is driven by the participant-host integration tests)."""

from __future__ import annotations

import asyncio

import pytest

from rayconnect.actors.reader_calls import ReaderCalls
from rayconnect.protocol.effects import Pause, ReaderSteer, Resume, Seek


class _Remote:
    def __init__(self, fn):  # noqa: ANN001
        self.remote = fn


class SlowReader:
    """Each call takes 10 ms; records the batches it got."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[list[ReaderSteer]] = []
        self.fail_on = fail_on
        self.steer = _Remote(self._steer)

    async def _steer(self, ops: list[ReaderSteer]) -> None:
        self.calls.append(list(ops))
        await asyncio.sleep(0.01)
        if self.fail_on and any(op.key == self.fail_on for op in ops):
            raise RuntimeError("reader died")


@pytest.mark.asyncio
async def test_a_lone_call_goes_at_once_and_the_rest_ride_in_the_next() -> None:
    reader = SlowReader()
    calls = ReaderCalls(reader)
    first = asyncio.ensure_future(calls.steer("c/t/0", Pause()))
    await asyncio.sleep(0)  # the first call is out
    rest = [calls.steer(f"c/t/{p}", Resume()) for p in range(1, 100)]
    rest.append(calls.steer("c/t/5", Seek(42)))
    await asyncio.gather(first, *rest)
    assert reader.calls[0] == [ReaderSteer("c/t/0", Pause())]
    assert len(reader.calls) == 2, "99 partitions' calls behind the first: one more call"
    assert reader.calls[1][:2] == [
        ReaderSteer("c/t/1", Resume()),
        ReaderSteer("c/t/2", Resume()),
    ]
    assert reader.calls[1][-1] == ReaderSteer("c/t/5", Seek(42))


@pytest.mark.asyncio
async def test_a_failed_call_fails_its_callers_only_and_later_calls_go_out() -> None:
    reader = SlowReader(fail_on="c/t/1")
    calls = ReaderCalls(reader)
    await calls.steer("c/t/0", Pause())
    with pytest.raises(RuntimeError, match="reader died"):
        await calls.steer("c/t/1", Pause())
    await calls.steer("c/t/0", Resume())
    assert reader.calls[-1] == [ReaderSteer("c/t/0", Resume())]
