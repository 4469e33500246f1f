"""The topics a source writes to, made by the source - not left to a broker's auto-create.

A broker that creates a topic on its first write (``auto.create.topics.enable``) picks the
partition count itself (``num.partitions``: 1 on Apache Kafka, whatever the operator set
elsewhere), and one that does not makes the first send wait until it times out. So a source
task names its topics with their partition count (``SourceTask.topics``) and the task's
runner makes the missing ones before the first poll, every start (a table added to a
publication gets its topic at the next start). A topic that exists is kept as it is, whatever
its partition count. A broker that refuses to create one (no permission, a policy) stops the
start with ``TopicsNotCreatedError`` naming each topic, its count and the broker's reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from rayconnect.errors import ConfigError


class TopicSpec(msgspec.Struct, frozen=True):
    """A topic a source writes to, and the partitions it is made with if it is missing."""

    name: str
    partitions: int
    replication_factor: int = 1


class TopicsNotCreatedError(ConfigError):
    """Topics a source writes to do not exist and the broker refused to create them."""


def not_created(refused: Mapping[str, str], specs: Iterable[TopicSpec]) -> TopicsNotCreatedError:
    """The error for the topics the broker ``refused`` (name -> its reason): each with the
    partition count it was asked for, and what to do."""
    count = {s.name: s.partitions for s in specs}
    listed = "; ".join(
        f"{name} ({count.get(name, '?')} partitions): {reason}"
        for name, reason in sorted(refused.items())
    )
    return TopicsNotCreatedError(
        f"topics: the source writes to topics that do not exist, and the broker refused to "
        f"create them - {listed}. Create them (with those partition counts), or let the "
        "source's Kafka user create topics"
    )


async def ensure_topics(
    bootstrap: str, specs: Iterable[TopicSpec], timeout_s: float = 30.0, **client: Any
) -> list[str]:
    """Make the topics of ``specs`` that do not exist yet; the names it made. Raises
    ``TopicsNotCreatedError`` for those the broker refused."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    wanted = {s.name: s for s in specs}
    if not wanted:
        return []
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000), **client
    )
    await admin.start()
    try:
        missing = [s for name, s in sorted(wanted.items()) if name not in await admin.list_topics()]
        if not missing:
            return []
        new = [NewTopic(s.name, s.partitions, s.replication_factor) for s in missing]
        try:
            response = await admin.create_topics(new)
        except Exception as e:  # the request as a whole (e.g. CreateTopics not allowed)
            reason = f"{type(e).__name__}: {e}"
            raise not_created({s.name: reason for s in missing}, missing) from None
        refused: dict[str, str] = {}
        for topic, code, *rest in response.topic_errors:
            error = for_code(code)
            if code == 0 or error is TopicAlreadyExistsError:
                continue
            message = rest[0] if rest and isinstance(rest[0], str) else None
            refused[topic] = error.__name__ + (f": {message}" if message else "")
        if refused:
            raise not_created(refused, missing)
        # visible in metadata before the first send: a producer must not race the creation
        deadline = time.monotonic() + timeout_s
        while not {s.name for s in missing} <= set(await admin.list_topics()):
            if time.monotonic() > deadline:
                raise TopicsNotCreatedError(
                    f"topics: {[s.name for s in missing]} created but not visible in the "
                    f"broker's metadata after {timeout_s:g} s"
                )
            await asyncio.sleep(0.05)
        return [s.name for s in missing]
    finally:
        await admin.close()
