"""Transactional producers for source tasks: the probe, the fence, safe shutdown.

Fencing is InitProducerId on a transactional id: the broker bumps the id's epoch, aborts
the transaction the previous holder left open, and rejects that holder's later writes and
commits. Doing it for every id of the old generation before any task of the new one starts
is what keeps a zombie's records and offsets out (a new task's own init only fences the
same index, not an index that no longer exists after the task count shrank).

Shutdown: a fenced producer on tansu never gets an answer to EndTxn (the broker closes the
connection; aiokafka retries until stopped), so every wait below has a timeout and a
producer that failed is stopped, not reused.

Before a commit, every send of the transaction must have been stored where the broker said
(``confirm_stored``): a broker answers a retried batch DUPLICATE_SEQUENCE_NUMBER when it has
its sequence already, and aiokafka then resolves the batch with offset -1 and no error. Kafka
says so only for a batch it stored; tansu 0.6.0 (S3 engine) advances the sequence before it
stores the batch, so a broker stopped between the two answers the retry "duplicate" for
records it never stored (bench/results/tansu_restart_loss.md). Committing then would commit
a hole; aborting instead writes the records again. Against Kafka the check costs a redo of
the rare transaction whose retried batch Kafka stored but no longer knew the offset of.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer

from rayconnect.errors import RayconnectError
from rayconnect.kafka import compat

TXN_APIS = {22: "InitProducerId", 24: "AddPartitionsToTxn", 26: "EndTxn"}


class TransactionsUnsupported(RuntimeError):
    """The target cluster cannot run transactions; the message says why."""


class UnconfirmedWrite(RayconnectError, RuntimeError):
    """The broker acknowledged a batch without saying where it stored it (offset -1, its
    DUPLICATE_SEQUENCE_NUMBER answer): the transaction must not be committed."""


def confirm_stored(results: Iterable[Any]) -> None:
    """Raise UnconfirmedWrite if any send's RecordMetadata has a negative offset (the first
    record of a batch answered as a duplicate; aiokafka numbers the rest -1 + i)."""
    unconfirmed = sorted({(r.topic, r.partition) for r in results if r.offset < 0})
    if unconfirmed:
        where = ", ".join(f"{topic}/{partition}" for topic, partition in unconfirmed)
        raise UnconfirmedWrite(
            f"the broker answered a retried batch as a duplicate without its offset ({where}):"
            " it may not have stored it, so the transaction is aborted and written again"
        )


def producer(bootstrap: str, transactional_id: str | None, **kwargs: Any) -> AIOKafkaProducer:
    settings: dict[str, Any] = {"acks": "all", "linger_ms": 5, "max_batch_size": 256 * 1024}
    settings.update(kwargs)
    if transactional_id is not None:
        settings["transactional_id"] = transactional_id
    return compat.own(AIOKafkaProducer(bootstrap_servers=bootstrap, **settings))


async def stop_quietly(p: AIOKafkaProducer, timeout_s: float = 5.0) -> None:
    with contextlib.suppress(Exception, asyncio.TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(p.stop(), timeout_s)


async def init_transactions(p: AIOKafkaProducer, timeout_s: float) -> None:
    """``start()`` of a transactional aiokafka producer is initTransactions."""
    try:
        await asyncio.wait_for(p.start(), timeout_s)
    except BaseException:
        await stop_quietly(p)
        raise


async def fence(
    bootstrap: str, transactional_ids: Iterable[str], timeout_s: float = 30.0, **client: Any
) -> None:
    """Bump the epoch of every id (concurrently): their current holders are zombies now."""

    async def one(tid: str) -> None:
        p = producer(bootstrap, tid, **client)
        await init_transactions(p, timeout_s)
        await stop_quietly(p)

    await asyncio.gather(*(one(t) for t in transactional_ids))


async def probe(bootstrap: str, probe_id: str, timeout_s: float = 15.0, **client: Any) -> None:
    """Raise TransactionsUnsupported unless the cluster advertises the transaction APIs and
    really initialises a transactional producer (``probe_id``) within ``timeout_s``."""
    p = producer(bootstrap, probe_id, **client)
    try:
        await asyncio.wait_for(p.client.bootstrap(), timeout_s)
        node = p.client.get_random_node()
        conn = await p.client._get_conn(node) if node is not None else None
        versions = getattr(conn, "_versions", None) or {}
        missing = [name for key, name in TXN_APIS.items() if versions and key not in versions]
        if missing:
            raise TransactionsUnsupported(f"the broker does not offer {', '.join(missing)}")
        await init_transactions(p, timeout_s)
    except TransactionsUnsupported:
        raise
    except (TimeoutError, Exception) as e:
        raise TransactionsUnsupported(
            f"initialising a transactional producer failed: {type(e).__name__}: {e}"
        ) from e
    finally:
        await stop_quietly(p)
