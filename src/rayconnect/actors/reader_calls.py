"""A participant host's steering of one reader (seek, pause, resume) as few Ray calls.

At the start and end of a round every partition's machine may pause, resume or seek its
reader. One Ray call each is a thousand calls a round at 1,024 partitions, each a round
trip through the reader's event loop. A host instead keeps ONE call in flight per reader:
what its partitions ask while it is out goes in the next call, in order. A lone request
goes out at once (no gathering delay); under load the calls carry many operations each.

Order holds per partition because a machine awaits each of its steering calls before its
next effect (the host's per-partition lock); partitions need no order among themselves.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rayconnect.protocol.effects import ReaderSteer, Steer


class ReaderCalls:
    """The steering calls of one host to one reader actor."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self._queue: list[tuple[ReaderSteer, asyncio.Future[None]]] = []
        self._sending: asyncio.Task[None] | None = None

    async def steer(self, key: str, action: Steer) -> None:
        """Carried out by the reader when this returns; raises what the call raised."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((ReaderSteer(key, action), future))
        if self._sending is None:
            self._sending = asyncio.ensure_future(self._drain())
        await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    await self.reader.steer.remote([op for op, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)
        finally:
            self._sending = None
