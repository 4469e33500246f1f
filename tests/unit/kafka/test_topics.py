"""The source's topics: the error a broker's refusal becomes (pure; the creation itself runs
against the real broker in the Postgres source tests)."""

from __future__ import annotations

import rayconnect as rc
from rayconnect.kafka.topics import TopicsNotCreatedError, TopicSpec, not_created


def test_a_refusal_names_each_topic_its_partitions_the_reason_and_the_fix() -> None:
    specs = [TopicSpec("shop.public.orders", 4), TopicSpec("shop.public.items", 4)]
    refused = {
        "shop.public.orders": "TopicAuthorizationFailedError",
        "shop.public.items": "PolicyViolationError: no topics here",
    }
    error = not_created(refused, specs)
    assert isinstance(error, TopicsNotCreatedError) and isinstance(error, rc.ConfigError)
    text = str(error)
    assert text.startswith("topics: the source writes to topics that do not exist")
    assert "shop.public.items (4 partitions): PolicyViolationError: no topics here" in text
    assert "shop.public.orders (4 partitions): TopicAuthorizationFailedError" in text
    assert "Create them (with those partition counts), or let the source's Kafka user" in text


def test_run_with_an_embedded_broker_leaves_a_postgres_source_its_topics() -> None:
    from rayconnect.config.source import GeneratorTask, PostgresTask

    assert PostgresTask.makes_topics and not GeneratorTask.makes_topics


def test_a_postgres_source_names_no_topic_before_it_started() -> None:
    task = rc.PostgresSource(dsn="host=db", slot="s", tables=["a"], topic_partitions=6)
    assert task.topics() == []
    assert task.settings.topic_partitions == 6 and task.settings.topic_replication_factor == 1
