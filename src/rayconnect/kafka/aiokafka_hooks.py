"""The one door through which rayconnect replaces names inside aiokafka (pinned:
``aiokafka==0.14.0`` in pyproject.toml).

Why patch at all: aiokafka has no extension points for what rayconnect needs - transactions
against brokers like tansu (``kafka.compat``) and a fetch path that decodes whole batches
into Arrow columns (``kafka.arrow_fetch``) - and it builds the objects concerned internally,
by module-level name. Why one door: the hooked names are private and each may move in any
aiokafka release; here they are listed once, with the value each had before rayconnect
touched it, so an upgrade is checked against this list and the tests of the two modules
above (each proves its fix is still needed and still works), and no other module assigns
into aiokafka. The replacements are installed for the process but act only for the clients
rayconnect built (``kafka.compat.own``); for any other client each hands over to the value
listed here.

The hooked names (all of aiokafka 0.14.0):

- ``aiokafka.producer.sender.InitProducerIdRequest``: the request builder the sender looks
  up when a transactional producer starts;
- ``aiokafka.producer.sender.Sender.start``: where all of a producer's sender work starts;
- ``aiokafka.errors.for_code``: error code -> class, as the sender's handlers call it;
- ``aiokafka.consumer.fetcher.PartitionRecords``: built per partition per fetch response;
- ``aiokafka.consumer.fetcher.MemoryRecords``: wraps the fetched bytes of a partition;
- ``aiokafka.consumer.fetcher.Fetcher._proc_fetch_request``: handles one fetch response.
"""

from __future__ import annotations

import enum
from typing import Any

import aiokafka.consumer.fetcher as _fetcher
import aiokafka.errors as _errors
import aiokafka.producer.sender as _sender


class Hook(enum.Enum):
    """A name inside aiokafka that rayconnect replaces."""

    INIT_PRODUCER_ID_REQUEST = "aiokafka.producer.sender.InitProducerIdRequest"
    SENDER_START = "aiokafka.producer.sender.Sender.start"
    FOR_CODE = "aiokafka.errors.for_code"
    PARTITION_RECORDS = "aiokafka.consumer.fetcher.PartitionRecords"
    MEMORY_RECORDS = "aiokafka.consumer.fetcher.MemoryRecords"
    PROC_FETCH_REQUEST = "aiokafka.consumer.fetcher.Fetcher._proc_fetch_request"


_OWNER: dict[Hook, tuple[Any, str]] = {
    Hook.INIT_PRODUCER_ID_REQUEST: (_sender, "InitProducerIdRequest"),
    Hook.SENDER_START: (_sender.Sender, "start"),
    Hook.FOR_CODE: (_errors, "for_code"),
    Hook.PARTITION_RECORDS: (_fetcher, "PartitionRecords"),
    Hook.MEMORY_RECORDS: (_fetcher, "MemoryRecords"),
    Hook.PROC_FETCH_REQUEST: (_fetcher.Fetcher, "_proc_fetch_request"),
}

_ORIGINAL: dict[Hook, Any] = {hook: getattr(*where) for hook, where in _OWNER.items()}

#: aiokafka's own values, before any hook: what the replacements subclass, wrap or hand over to.
ORIGINAL_INIT_PRODUCER_ID_REQUEST: Any = _ORIGINAL[Hook.INIT_PRODUCER_ID_REQUEST]
ORIGINAL_SENDER_START: Any = _ORIGINAL[Hook.SENDER_START]
ORIGINAL_FOR_CODE: Any = _ORIGINAL[Hook.FOR_CODE]
ORIGINAL_PARTITION_RECORDS: Any = _ORIGINAL[Hook.PARTITION_RECORDS]
ORIGINAL_MEMORY_RECORDS: Any = _ORIGINAL[Hook.MEMORY_RECORDS]
ORIGINAL_PROC_FETCH_REQUEST: Any = _ORIGINAL[Hook.PROC_FETCH_REQUEST]


def replace(hook: Hook, value: object) -> None:
    """Make aiokafka use ``value`` where it used the hooked name."""
    owner, name = _OWNER[hook]
    setattr(owner, name, value)


def restore(hook: Hook) -> None:
    """Give aiokafka back its own value of the hooked name."""
    replace(hook, _ORIGINAL[hook])
