"""The enumerator (protocol/enumerator.py, cluster_enumerator.py): every transition, the
per-cluster restart rule, stable assignment, failures, and a property over metadata histories."""

from __future__ import annotations

import pytest
from enumerator_harness import World, address, keys, stream
from hypothesis import given, settings
from hypothesis import strategies as st

from rayconnect.protocol.cluster_enumerator import TRANSITIONS as CLUSTER_TRANSITIONS
from rayconnect.protocol.cluster_enumerator import (
    ClusterEnumerator,
    ClusterEvent,
    ClusterSnapshot,
    ClusterState,
    Plan,
    normalized,
)
from rayconnect.protocol.enumerator import (
    TRANSITIONS,
    Enumerator,
    EnumeratorConfig,
    Event,
    State,
)
from rayconnect.protocol.enumerator_effects import (
    AssignPartitions,
    DiscoverPartitions,
    FailPipeline,
    PollMetadata,
    SendMetadataUpdate,
    StartReaders,
    StopReaders,
)
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.messages import GetMetadataUpdateEvent
from rayconnect.protocol.types import ClusterMetadata, KafkaStream, TopicPartition

ORDERS = stream("orders", east=["orders"], west=["orders"])


def running(**config: object) -> World:
    """A world running ORDERS on east and west, 2 partitions each, effects log cleared."""
    world = World.make(**config)
    world.tick()
    world.poll(ORDERS)
    world.effects.clear()
    return world


def kinds(effects: list) -> list[str]:
    return [type(e).__name__ for e in effects]


# -- INIT and polling ----------------------------------------------------------------------


def test_first_tick_polls_once_until_answered() -> None:
    world = World.make()
    assert world.tick() == [PollMetadata()]
    assert world.tick(1.0) == []  # one poll outstanding at a time
    assert world.enumerator.next_deadline() is None
    world.poll(ORDERS)
    assert world.enumerator.next_deadline() == pytest.approx(11.0)


def test_first_metadata_discovers_then_assigns_then_starts_readers() -> None:
    world = World.make()
    world.tick()
    done = world.poll(ORDERS)
    assert kinds(done) == [
        "DiscoverPartitions",
        "AssignPartitions",
        "StartReaders",
        "DiscoverPartitions",
        "AssignPartitions",
        "StartReaders",
    ]
    assert world.enumerator.state is State.RUNNING
    assert world.assigned == keys("east", "orders", 2) | keys("west", "orders", 2)
    assert world.readers == {
        "east/0": keys("east", "orders", 2),
        "west/0": keys("west", "orders", 2),
    }
    start = world.of(StartReaders, "east")[0]
    assert start.cluster == ClusterMetadata(address("east"), ("orders",))


def test_discovery_before_metadata_is_a_protocol_error() -> None:
    enum = Enumerator()
    with pytest.raises(ProtocolError):
        enum.partitions_discovered("east", [], 0.0)
    with pytest.raises(ProtocolError):
        enum.discovery_failed("east", "x", 0.0)


def test_metadata_polled_needs_streams_or_error() -> None:
    with pytest.raises(ProtocolError):
        Enumerator().metadata_polled(None, None, 0.0)


def test_reader_request_in_init_waits_for_metadata() -> None:
    world = World.make(readers_per_cluster=1)
    world.tick()
    request = GetMetadataUpdateEvent("east/0")
    assert world.enumerator.get_metadata_update(request, 0.0) == []
    world.auto_answer = False
    done = world.poll(ORDERS)
    # east has no readers yet (discovery out): the early asker is stopped, not answered
    assert StopReaders("east", ("east/0",)) in done


# -- readers' start-up requests ------------------------------------------------------------


def test_reader_gets_its_splits_at_start_up() -> None:
    world = running()
    [update] = world.enumerator.get_metadata_update(GetMetadataUpdateEvent("east/0"), 1.0)
    assert isinstance(update, SendMetadataUpdate) and update.reader_id == "east/0"
    assert {s.partition.key for s in update.event.splits} == keys("east", "orders", 2)
    assert all(s.starting_offset is None for s in update.event.splits)  # offsets: the table's
    # only its own cluster's metadata (other clusters' properties may hold credentials)
    assert update.event.streams == (KafkaStream("orders", {"east": ORDERS.clusters["east"]}),)


def test_unknown_reader_is_stopped_and_malformed_id_ignored() -> None:
    world = running()
    enum = world.enumerator
    assert enum.get_metadata_update(GetMetadataUpdateEvent("east/7"), 1.0) == [
        StopReaders("east", ("east/7",))
    ]
    assert enum.get_metadata_update(GetMetadataUpdateEvent("gone/0"), 1.0) == [
        StopReaders("gone", ("gone/0",))
    ]
    assert enum.get_metadata_update(GetMetadataUpdateEvent("nonsense"), 1.0) == []
    assert enum.status().messages_ignored == 1


def test_reader_started_shows_in_status() -> None:
    world = running()
    enum = world.enumerator
    assert enum.reader_started("east/0", "east", 1.0) == []
    assert enum.reader_started("east/5", "east", 1.0) == []  # unknown: ignored, counted
    status = enum.status()
    assert status.clusters["east"].readers_started == ("east/0",)
    assert status.messages_ignored == 1


# -- partitions of existing topics -----------------------------------------------------------


def test_new_partitions_go_to_running_readers_without_moving_existing_splits() -> None:
    world = running(readers_per_cluster=2)
    before = {r: set(s) for r, s in world.readers.items()}
    assert before["east/0"] == {"east/orders/0"} and before["east/1"] == {"east/orders/1"}
    world.partitions[("east", "orders")] = 5
    done = world.tick(10.0)
    assert kinds(done).count("StartReaders") == 0 and kinds(done).count("StopReaders") == 0
    [assign] = [e for e in done if isinstance(e, AssignPartitions)]
    assert (
        assign.added == ("east/orders/2", "east/orders/3", "east/orders/4") and not assign.retired
    )
    for reader, splits in before.items():
        assert splits <= world.readers[reader]  # nothing moved
    assert world.readers["east/0"] == {"east/orders/0", "east/orders/2", "east/orders/4"}
    assert world.readers["east/1"] == {"east/orders/1", "east/orders/3"}
    updated = {e.reader_id for e in done if isinstance(e, SendMetadataUpdate)}
    assert updated == {"east/0", "east/1"}
    assert kinds(done).index("AssignPartitions") < kinds(done).index("SendMetadataUpdate")


def test_rediscovery_with_no_change_emits_nothing() -> None:
    world = running()
    done = world.tick(10.0)
    assert kinds(done) == ["DiscoverPartitions", "DiscoverPartitions", "PollMetadata"]


def test_new_splits_fill_the_least_loaded_reader() -> None:
    world = running(readers_per_cluster=3)
    world.poll(stream("orders", east=["orders", "more"], west=["orders"]))
    world.effects.clear()
    world.partitions[("east", "more")] = 4  # 2 -> 4
    world.tick(10.0)
    sizes = sorted(len(world.readers[f"east/{i}"]) for i in range(3))
    assert sizes == [2, 2, 2]


# -- topics and clusters come and go ---------------------------------------------------------


def test_topic_added_restarts_only_that_clusters_readers() -> None:
    world = running()
    done = world.poll(stream("orders", east=["orders", "orders-eu"], west=["orders"]))
    assert kinds(done) == ["DiscoverPartitions", "StopReaders", "AssignPartitions", "StartReaders"]
    assert world.of(StopReaders, "west") == [] and world.of(StartReaders, "west") == []
    assert world.of(DiscoverPartitions, "west") == []
    [assign] = world.of(AssignPartitions)
    assert set(assign.added) == keys("east", "orders-eu", 2)
    [start] = world.of(StartReaders)
    assert start.cluster.topics == ("orders", "orders-eu")
    assert world.readers["east/0"] == keys("east", "orders", 2) | keys("east", "orders-eu", 2)


def test_topic_removed_applies_at_once_without_the_broker() -> None:
    world = running()
    world.poll(stream("orders", east=["orders", "orders-eu"], west=["orders"]))
    world.effects.clear()
    world.unreachable.add("east")
    done = world.poll(stream("orders", east=["orders"], west=["orders"]))
    assert kinds(done) == ["StopReaders", "AssignPartitions", "StartReaders"]
    [assign] = world.of(AssignPartitions)
    assert set(assign.retired) == keys("east", "orders-eu", 2) and not assign.added
    assert world.readers["east/0"] == keys("east", "orders", 2)


def test_cluster_removed_while_unreachable_stops_readers_and_retires() -> None:
    world = running()
    world.unreachable.add("west")
    done = world.poll(stream("orders", east=["orders"]))
    assert done == [
        StopReaders("west", ("west/0",)),
        AssignPartitions(added=(), retired=tuple(sorted(keys("west", "orders", 2)))),
    ]
    assert "west/0" not in world.readers
    assert "west" not in world.enumerator.status().clusters


def test_cluster_re_added_joins_again_with_the_same_keys() -> None:
    world = running()
    world.poll(stream("orders", east=["orders"]))
    world.effects.clear()
    done = world.poll(ORDERS)
    assert kinds(done) == ["DiscoverPartitions", "AssignPartitions", "StartReaders"]
    [assign] = world.of(AssignPartitions)
    assert set(assign.added) == keys("west", "orders", 2)
    assert world.of(StopReaders, "east") == [] and world.of(StartReaders, "east") == []


def test_unchanged_metadata_and_reordered_topics_are_not_changes() -> None:
    world = running()
    world.poll(ORDERS)
    world.poll(stream("orders", east=["orders", "orders"], west=["orders"]))
    assert world.effects == []
    assert world.enumerator.status().metadata_changes == 1


def test_new_stream_on_a_known_cluster_only_touches_that_cluster() -> None:
    world = running()
    done = world.poll(ORDERS, stream("payments", east=["payments"]))
    assert {getattr(e, "cluster_id", None) for e in done} <= {"east", None}
    assert world.of(StartReaders, "west") == [] and world.of(StopReaders, "west") == []


def test_empty_topic_list_means_no_cluster() -> None:
    world = running()
    done = world.poll(stream("orders", east=["orders"], west=[]))
    assert world.of(StopReaders, "west") and set(world.of(AssignPartitions)[0].retired) == keys(
        "west", "orders", 2
    )
    assert kinds(done)[0] == "StopReaders"


# -- address / property changes and unreachable brokers --------------------------------------


def moved_west(port: int = 9999) -> KafkaStream:
    return KafkaStream(
        "orders",
        {
            "east": ClusterMetadata(address("east"), ("orders",)),
            "west": ClusterMetadata(address("west", port), ("orders",)),
        },
    )


def test_address_change_keeps_old_splits_while_the_new_address_fails() -> None:
    world = running()
    world.unreachable.add("west")
    done = world.poll(moved_west())
    assert kinds(done) == ["DiscoverPartitions"]
    sub = world.enumerator.cluster("west")
    assert sub is not None and sub.state is ClusterState.CHANGING
    assert world.readers["west/0"] == keys("west", "orders", 2)  # still reading
    status = world.enumerator.status().clusters["west"]
    assert status.consecutive_failures == 1 and status.last_error == "west unreachable"
    # east is not blocked: its rediscovery goes on
    world.partitions[("east", "orders")] = 3
    world.tick(10.0)
    assert "east/orders/2" in world.readers["east/0"]
    # the new address answers: west restarts with it
    world.unreachable.clear()
    world.effects.clear()
    world.tick(10.0)
    [start] = world.of(StartReaders, "west")
    assert start.cluster.bootstrap_servers == address("west", 9999)
    assert world.of(StopReaders, "west") and not world.of(AssignPartitions, "west")
    assert sub.state is ClusterState.ACTIVE and sub.failures == 0


def test_property_change_restarts_readers_with_the_same_splits() -> None:
    world = running(readers_per_cluster=2)
    before = dict(world.readers)
    secured = KafkaStream(
        "orders",
        {
            "east": ClusterMetadata(address("east"), ("orders",)),
            "west": ClusterMetadata(address("west"), ("orders",), {"security.protocol": "SSL"}),
        },
    )
    done = world.poll(secured)
    assert kinds(done) == ["DiscoverPartitions", "StopReaders", "StartReaders"]
    assert world.readers == before


def test_unreachable_new_cluster_stays_pending_and_blocks_nobody() -> None:
    world = World.make()
    world.unreachable.add("west")
    world.tick()
    world.poll(ORDERS)
    assert set(world.readers) == {"east/0"}
    status = world.enumerator.status()
    assert status.clusters["west"].state == "pending" and status.clusters["west"].readers == {}
    world.unreachable.clear()
    world.tick(10.0)
    assert set(world.readers) == {"east/0", "west/0"}


def test_changed_back_while_changing_needs_no_restart_and_the_old_answer_is_stale() -> None:
    world = running()
    world.auto_answer = False
    world.poll(moved_west())
    [request] = world.pending
    world.poll(ORDERS)
    assert world.enumerator.cluster("west").state is ClusterState.ACTIVE  # type: ignore[union-attr]
    assert world.run(world.answer(request)) == []
    assert world.enumerator.status().messages_ignored == 1
    assert world.of(StartReaders) == [] and world.of(StopReaders) == []


def test_stale_answer_after_a_newer_request_is_ignored() -> None:
    world = running()
    world.auto_answer = False
    world.poll(moved_west(1111))
    world.poll(moved_west(2222))
    old, new = world.pending
    assert new.request_id > old.request_id
    assert world.run(world.answer(old)) == []
    world.run(world.answer(new))
    [start] = world.of(StartReaders, "west")
    assert start.cluster.bootstrap_servers == address("west", 2222)


def test_answer_for_a_removed_cluster_is_ignored() -> None:
    world = running()
    world.auto_answer = False
    world.tick(10.0)
    requests = {r.cluster_id: r for r in world.pending}
    world.poll(stream("orders", east=["orders"]))
    assert world.run(world.answer(requests["west"])) == []


def test_unasked_or_foreign_answers_are_protocol_errors() -> None:
    world = running()
    enum = world.enumerator
    with pytest.raises(ProtocolError, match="no discovery is outstanding"):
        enum.partitions_discovered("east", [], 1.0)
    world.auto_answer = False
    world.tick(10.0)
    request = world.of(DiscoverPartitions, "east")[-1]
    with pytest.raises(ProtocolError, match="not a partition"):
        enum.partitions_discovered(
            "east", [TopicPartition("west", "orders", 0)], 1.0, request.request_id
        )
    with pytest.raises(ProtocolError, match="not a partition"):
        enum.partitions_discovered("east", [TopicPartition("east", "other", 0)], 1.0)


def test_answer_without_request_id_applies_to_the_outstanding_request() -> None:
    world = running()
    world.auto_answer = False
    world.tick(10.0)
    parts = [TopicPartition("east", "orders", p) for p in range(3)]
    done = world.run(world.enumerator.partitions_discovered("east", parts, 10.0))
    assert kinds(done) == ["AssignPartitions", "SendMetadataUpdate"]


# -- metadata service failures -----------------------------------------------------------------


def test_failures_below_threshold_keep_the_last_good_metadata() -> None:
    world = running(discovery_failure_threshold=3)
    assert world.fail_poll("boom 1") == [] and world.fail_poll("boom 2") == []
    status = world.enumerator.status()
    assert status.state == "running" and status.consecutive_failures == 2
    assert status.last_error == "boom 2" and status.last_good_at == 0.0
    assert set(world.readers) == {"east/0", "west/0"}
    world.poll(ORDERS)  # a success resets the count
    assert world.enumerator.status().consecutive_failures == 0
    assert world.enumerator.status().last_error is None


def test_threshold_failures_fail_the_pipeline_and_then_nothing_happens() -> None:
    world = running(discovery_failure_threshold=2)
    world.fail_poll("a")
    [fail] = world.fail_poll("connection refused")
    assert isinstance(fail, FailPipeline) and "connection refused" in fail.reason
    assert "2 times in a row" in fail.reason
    enum = world.enumerator
    assert enum.state is State.FAILED and enum.next_deadline() is None
    assert world.tick(100.0) == []
    assert world.poll(ORDERS) == []
    assert enum.get_metadata_update(GetMetadataUpdateEvent("east/0"), 1.0) == []
    assert enum.partitions_discovered("east", [], 1.0) == []


def test_failures_in_init_count_too() -> None:
    world = World.make(discovery_failure_threshold=2)
    world.tick()
    assert world.fail_poll() == [] and world.enumerator.state is State.INIT
    assert world.tick(10.0) == [PollMetadata()]  # retried at the interval
    assert kinds(world.fail_poll()) == ["FailPipeline"]


def test_failed_enumerator_ignores_late_answers_and_readers() -> None:
    world = running(discovery_failure_threshold=1)
    world.fail_poll()
    enum = world.enumerator
    assert enum.discovery_failed("east", "late", 1.0, 99) == []
    assert enum.reader_started("east/0", "east", 1.0) == []
    assert enum.status().messages_ignored == 2


def test_rediscovery_failure_of_an_active_cluster_keeps_its_splits() -> None:
    world = running()
    world.unreachable.add("east")
    world.tick(10.0)
    sub = world.enumerator.cluster("east")
    assert sub is not None and sub.state is ClusterState.ACTIVE and sub.failures == 1
    assert world.readers["east/0"] == keys("east", "orders", 2)
    assert world.enumerator.next_deadline() == pytest.approx(20.0)


def test_inconsistent_metadata_counts_as_a_failure() -> None:
    world = running(discovery_failure_threshold=5)
    clash = KafkaStream("other", {"east": ClusterMetadata("elsewhere:1", ("x",))})
    assert world.poll(ORDERS, clash) == []
    status = world.enumerator.status()
    assert status.consecutive_failures == 1 and "two bootstrap addresses" in (
        status.last_error or ""
    )
    assert status.streams == ("orders",)


def test_warning_applies_the_metadata_and_is_shown_but_not_counted() -> None:
    world = running(discovery_failure_threshold=1)
    done = world.poll(ORDERS, error="streams.yaml: bad field - at `$.streams[0]`")
    assert done == []
    status = world.enumerator.status()
    assert status.state == "running" and status.consecutive_failures == 0
    assert status.last_error and "streams.yaml" in status.last_error


# -- subscription and status -------------------------------------------------------------------


def test_stream_ids_and_pattern_select_streams() -> None:
    world = World.make(stream_ids=("orders", "absent"), stream_pattern="pay.*")
    world.tick()
    world.poll(
        ORDERS,
        stream("payments", south=["pay"]),
        stream("payroll-archive", north=["x"]),
        stream("audit", east=["audit"]),
    )
    status = world.enumerator.status()
    assert status.streams == ("orders", "payments", "payroll-archive")
    assert status.missing_streams == ("absent",)
    assert set(status.clusters) == {"east", "west", "south", "north"}
    assert status.clusters["east"].topics == ("orders",)  # audit is not subscribed


def test_status_shows_clusters_splits_and_changes() -> None:
    world = running(readers_per_cluster=2)
    status = world.enumerator.status()
    assert status.partitions == 4 and status.metadata_changes == 1
    assert status.splits_per_reader == {
        "east/0": ("east/orders/0",),
        "east/1": ("east/orders/1",),
        "west/0": ("west/orders/0",),
        "west/1": ("west/orders/1",),
    }
    east = status.clusters["east"]
    assert east.state == "active" and east.bootstrap_servers == address("east")
    assert not east.discovering


def test_config_is_validated() -> None:
    for bad in (
        {"discovery_interval_s": 0},
        {"discovery_failure_threshold": 0},
        {"readers_per_cluster": 0},
        {"stream_pattern": "("},
    ):
        with pytest.raises(ValueError):
            EnumeratorConfig(**bad)  # type: ignore[arg-type]


# -- snapshot / restore -------------------------------------------------------------------------


def test_restored_enumerator_keeps_running_readers_and_answers_after_fresh_metadata() -> None:
    world = running(readers_per_cluster=2)
    snap = world.enumerator.snapshot()
    config = world.enumerator.config
    restored = World(Enumerator.restore(snap, config, 50.0), now=50.0)
    restored.readers = dict(world.readers)
    restored.assigned = set(world.assigned)
    assert restored.enumerator.state is State.INIT
    assert restored.enumerator.reader_started("east/0", "east", 50.0) == []
    assert restored.enumerator.status().clusters["east"].readers_started == ("east/0",)
    assert restored.enumerator.get_metadata_update(GetMetadataUpdateEvent("east/1"), 50.0) == []
    restored.tick()
    done = restored.poll(stream("orders", east=["orders"]))  # west left meanwhile
    assert kinds(done) == ["StopReaders", "AssignPartitions", "SendMetadataUpdate"]
    assert done[-1].reader_id == "east/1"
    assert restored.of(StartReaders) == []


def test_restore_refuses_another_reader_count() -> None:
    world = running(readers_per_cluster=2)
    with pytest.raises(ProtocolError, match="readers_per_cluster"):
        Enumerator.restore(
            world.enumerator.snapshot(), EnumeratorConfig(readers_per_cluster=3), 0.0
        )


# -- the tables ---------------------------------------------------------------------------------


def test_tables_cover_every_state() -> None:
    assert set(TRANSITIONS.rows) == set(State)
    assert set(CLUSTER_TRANSITIONS.rows) == set(ClusterState)
    assert "RUNNING" in TRANSITIONS.describe()


def test_enumerator_table_ignores_deliberate_no_ops_and_its_holes_raise() -> None:
    ignored = TRANSITIONS.ignored()
    assert ignored[State.FAILED] == frozenset(Event)  # inert: late inputs still arrive
    assert ignored[State.INIT] == {Event.UNKNOWN_READER, Event.NOT_A_READER}
    assert ignored[State.RUNNING] == {
        Event.UNKNOWN_READER,
        Event.NOT_A_READER,
        Event.STALE_ANSWER,
    }
    holes = [(State.INIT, e) for e in Event if e.name.endswith("ANSWER") or "DISCOVER" in e.name]
    assert len(holes) == 4
    for state, event in [*holes, (State.RUNNING, Event.UNASKED_ANSWER)]:
        with pytest.raises(
            ProtocolError, match=f"{event.name} cannot happen in state {state.name}"
        ):
            TRANSITIONS.move(state, event)


def test_a_restored_enumerator_in_init_refuses_any_discovery_answer() -> None:
    world = running()
    restored = Enumerator.restore(world.enumerator.snapshot(), world.enumerator.config, 50.0)
    with pytest.raises(ProtocolError, match="STALE_ANSWER cannot happen in state INIT"):
        restored.partitions_discovered("east", [], 50.0, request_id=1)  # the old incarnation's
    with pytest.raises(ProtocolError, match="UNASKED_ANSWER cannot happen in state INIT"):
        restored.discovery_failed("east", "x", 50.0)
    assert restored.state is State.INIT and restored.status().messages_ignored == 0


def test_a_failed_enumerator_ignores_and_counts_every_input() -> None:
    world = running(discovery_failure_threshold=1)
    world.fail_poll()
    enum = world.enumerator
    assert enum.tick(100.0) == []
    assert enum.metadata_polled([ORDERS], None, 100.0) == []
    assert enum.metadata_polled(None, "down", 100.0) == []
    assert enum.get_metadata_update(GetMetadataUpdateEvent("east/0"), 100.0) == []
    assert enum.get_metadata_update(GetMetadataUpdateEvent("nonsense"), 100.0) == []
    assert enum.partitions_discovered("east", [], 100.0) == []  # unasked: a hole elsewhere
    assert enum.reader_started("west/0", "west", 100.0) == []
    status = enum.status()
    assert status.state == "failed" and status.messages_ignored == 7
    assert status.consecutive_failures == 1  # the ignored failed poll changed nothing


def test_cluster_table_ignores_repeats_and_idle_ticks_and_its_holes_raise() -> None:
    live = (ClusterState.PENDING, ClusterState.ACTIVE, ClusterState.CHANGING)
    for state in live:
        assert CLUSTER_TRANSITIONS.ignored()[state] == {
            ClusterEvent.UNCHANGED,
            ClusterEvent.NOT_DUE,
        }
    holes = [
        (ClusterState.PENDING, ClusterEvent.REVERTED),  # no readers run
        (ClusterState.PENDING, ClusterEvent.TOPICS_REMOVED),
        (ClusterState.ACTIVE, ClusterEvent.REVERTED),  # what runs is what is desired
        (ClusterState.ACTIVE, ClusterEvent.RESUMED),
        (ClusterState.CHANGING, ClusterEvent.RESUMED),
        *((ClusterState.REMOVED, e) for e in ClusterEvent),
    ]
    for state, event in holes:
        with pytest.raises(ProtocolError, match=f"{event.name} cannot happen"):
            CLUSTER_TRANSITIONS.move(state, event)


def test_cluster_ignores_the_same_metadata_and_a_tick_with_nothing_due() -> None:
    sub = ClusterEnumerator("east", 1, 10.0, lambda: 1, now=0.0)
    meta = ClusterMetadata(address("east"), ("orders",))
    [discover] = sub.desire(meta, 0.0).discover
    assert sub.desire(ClusterMetadata(address("east"), ("orders", "orders")), 1.0) == Plan()
    assert sub.due(100.0) == Plan()  # the discovery is still out
    assert sub.state is ClusterState.PENDING and sub.request_id == discover.request_id


def test_a_removed_or_running_cluster_refuses_what_cannot_happen_to_it() -> None:
    world = running()
    east = world.enumerator.cluster("east")
    assert east is not None and east.state is ClusterState.ACTIVE
    snap = east.snapshot()
    assert isinstance(snap, ClusterSnapshot)
    with pytest.raises(ProtocolError, match="RESUMED cannot happen in state ACTIVE"):
        east.resume(snap)
    east.remove()
    assert east.state is ClusterState.REMOVED
    with pytest.raises(ProtocolError, match="cannot happen in state REMOVED"):
        east.due(100.0)
    with pytest.raises(ProtocolError, match="cannot happen in state REMOVED"):
        east.desire(ClusterMetadata(address("east"), ("orders",)), 100.0)


# -- property: any history of metadata versions --------------------------------------------------

CLUSTERS = ("a", "b", "c")
TOPICS = ("t1", "t2", "t3")

cluster_meta = st.fixed_dictionaries(
    {
        "topics": st.lists(st.sampled_from(TOPICS), max_size=3),
        "port": st.sampled_from((1, 2)),
    }
)
version = st.tuples(
    st.dictionaries(st.sampled_from(CLUSTERS), cluster_meta, max_size=3),
    st.dictionaries(
        st.tuples(st.sampled_from(CLUSTERS), st.sampled_from(TOPICS)), st.integers(1, 4)
    ),
)


def as_stream(clusters: dict[str, dict]) -> KafkaStream:
    return KafkaStream(
        "s",
        {
            cid: ClusterMetadata(address(cid, m["port"]), tuple(m["topics"]))
            for cid, m in clusters.items()
        },
    )


@settings(max_examples=250, deadline=None)
@given(st.lists(version, min_size=1, max_size=8), st.integers(1, 3))
def test_assignment_always_matches_the_current_metadata(history: list, readers: int) -> None:
    world = World.make(readers_per_cluster=readers)
    world.tick()
    previous: dict[str, ClusterMetadata] = {}
    for clusters, growth in history:
        # partitions only grow (Kafka cannot shrink a topic)
        for tp, n in growth.items():
            world.partitions[tp] = max(world.partitions.get(tp, 2), n)
        before = {r: set(s) for r, s in world.readers.items()}
        current = {cid: normalized(meta) for cid, meta in as_stream(clusters).clusters.items()}
        world.effects.clear()
        world.poll(as_stream(clusters))
        world.tick(10.0)  # rediscovery picks up grown partitions
        for cid, meta in current.items():  # an unchanged cluster's readers are untouched
            if meta.topics and previous.get(cid) == meta:
                assert not world.of(StartReaders, cid) and not world.of(StopReaders, cid)
        previous = {cid: meta for cid, meta in current.items() if meta.topics}
        expected = {
            TopicPartition(cid, t, p).key
            for cid, m in clusters.items()
            for t in set(m["topics"])
            for p in range(world.partitions.get((cid, t), 2))
        }
        splits = world.split_keys()
        assert sorted(splits) == sorted(expected)  # each split on exactly one reader
        assert world.assigned == expected
        assert world.enumerator.splits() == {
            r: tuple(s) for r, s in world.enumerator.splits().items()
        }
        for reader, old in before.items():  # a surviving split never changes reader
            for key in old & expected:
                assert key in world.readers[reader]
        for reader in world.readers:
            assert reader.split("/")[0] in clusters and int(reader.split("/")[1]) < readers
