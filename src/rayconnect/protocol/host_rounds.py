"""A round's messages between the coordinator and participant hosts: per host, not per
partition.

The machines speak per partition (``Broadcast`` to the round's keys; a WRITE-STATUS per
participant). Between processes, what a host's partitions say or are told at one moment
travels as one message (``messages.HostRound``, ``messages.HostWriteStatus``), so a round
costs the coordinator a few objects per host, not per partition. Both directions are pure
functions here, beside the machines they serve, so the benchmark of the coordinator alone
(bench/coordinator_alone.py) measures exactly what the actors do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rayconnect.protocol.messages import (
    AckCommit,
    Drained,
    EndCommit,
    HostRound,
    HostWriteStatus,
    Message,
    ParticipantStarted,
    RequestCommit,
    RoundLost,
    StartCommit,
    WriteStatus,
)


class HostAddresses:
    """Partition keys -> their hosts, for the coordinator's messages. A round's recipients
    are the same tuple round after round (the machine keeps it while its partitions stay),
    so the grouping is made once per change of the partitions, not once per message."""

    def __init__(self, host_of: Callable[[str], str]) -> None:
        self._host_of = host_of
        self._last: tuple[Sequence[str], dict[str, list[str]]] | None = None

    def group(self, keys: Sequence[str]) -> dict[str, list[str]]:
        """Host name -> its keys among ``keys``, in their order."""
        last = self._last
        if last is not None and last[0] is keys:
            return last[1]
        by_host: dict[str, list[str]] = {}
        host_of = self._host_of
        for key in keys:
            by_host.setdefault(host_of(key), []).append(key)
        if len(keys) > 1:  # a SendMessage's one key is not worth remembering
            self._last = (keys, by_host)
        return by_host

    def address(
        self,
        message: Message,
        keys: Sequence[str],
        outbox: dict[str, list[HostRound]],
    ) -> None:
        """Add ``message`` for ``keys`` to ``outbox`` (host name -> its messages in order),
        one ``HostRound`` per host."""
        if not isinstance(message, StartCommit | EndCommit | AckCommit):
            raise TypeError(f"the coordinator sends participants no {type(message).__name__}")
        for host, host_keys in self.group(keys).items():
            outbox.setdefault(host, []).append(HostRound.of(message, host_keys))


def unpack_rounds(rounds: Iterable[HostRound]) -> dict[str, list[Message]]:
    """A host's view of the coordinator's messages: partition key -> its messages, in order."""
    by_key: dict[str, list[Message]] = {}
    for host_round in rounds:
        for key, message in host_round.per_partition():
            by_key.setdefault(key, []).append(message)
    return by_key


def _partitions_of(message: Message) -> tuple[str, ...]:
    """The partitions a host's message to the coordinator speaks for."""
    if isinstance(message, WriteStatus | RequestCommit | Drained | RoundLost | ParticipantStarted):
        return (message.partition,)
    if isinstance(message, HostWriteStatus):
        return message.partitions
    return ()


def pack_statuses(messages: Iterable[Message]) -> list[Message]:
    """A host's messages to the coordinator, with the WRITE-STATUS of one round packed into
    one HOST-WRITE-STATUS.

    A status joins the pack of its round only if no message since that pack began named its
    partition: it moves ahead only of other partitions' messages, so what the coordinator
    sees of each partition comes in the order its participant said it (it steps a pack's
    statuses one by one: the outcome is that of the messages sent one by one)."""
    out: list[Message | list[WriteStatus]] = []
    # round -> its open pack, and the partitions named since that pack began
    packs: dict[tuple[int, int], tuple[list[WriteStatus], set[str]]] = {}
    for message in messages:
        keys = _partitions_of(message)
        if isinstance(message, WriteStatus):
            round_ = (message.epoch, message.txn_id)
            pack = packs.get(round_)
            if pack is not None and message.partition not in pack[1]:
                pack[0].append(message)
            else:
                pack = packs[round_] = ([message], set())
                out.append(pack[0])
        else:
            out.append(message)
        for _, named in packs.values():
            named.update(keys)
    return [
        (HostWriteStatus.of(m) if len(m) > 1 else m[0]) if isinstance(m, list) else m for m in out
    ]
