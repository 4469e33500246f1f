"""The reader's positions, pure: each rule on its own, then a property over random polls,
deliveries, seeks, pauses, resumes, failed hands, failed polls and re-assignments against
a fake consumer (aiokafka's position rules) and fake participants."""

from __future__ import annotations

from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from rayconnect.protocol.reader_positions import (
    PLACEHOLDER,
    Hand,
    PollToken,
    ReaderPositions,
    Seek,
)


def reader(*keys: str, at: int | None = 10) -> ReaderPositions:
    r = ReaderPositions()
    r.assign(keys)
    for key in keys:
        if at is not None:
            r.seek(key, at)
        r.resume(key)
    return r


def test_new_splits_get_a_placeholder_and_stay_paused_until_their_participant_resumes() -> None:
    r = ReaderPositions()
    plan = r.assign(["b", "a"])
    assert (plan.splits, plan.added, plan.dropped) == (("a", "b"), ("a", "b"), ())
    assert plan.pause == ("a", "b")
    assert plan.seek == (Seek("a", PLACEHOLDER), Seek("b", PLACEHOLDER))
    assert r.position("a") is None and not r.any_resumed


def test_reassigning_restores_the_kept_splits_positions_and_pauses() -> None:
    r = reader("a", "b")
    r.pause("b")
    plan = r.assign(["a", "b", "c"])
    assert (plan.added, plan.pause) == (("c",), ("b", "c"))
    assert plan.seek == (Seek("a", 10), Seek("b", 10), Seek("c", PLACEHOLDER))
    plan = r.assign(["c"])
    assert plan.dropped == ("a", "b") and r.seek("a", 3) is None and not r.pause("a")


def test_a_batch_is_handed_from_the_position_even_past_a_hole() -> None:
    r = reader("a")
    token = r.poll()
    assert r.fetched(token, "a", 12) == 10  # offsets 10, 11 were transaction markers
    assert r.piece(token, "a", 10, 15) == Hand("a", 10, 15)
    assert r.position("a") == 15


def test_a_batch_before_the_position_is_put_back() -> None:
    r = reader("a")
    assert r.fetched(r.poll(), "a", 7) == Seek("a", 10)


def test_a_seek_wins_over_a_poll_in_flight() -> None:
    r = reader("a")
    token = r.poll()
    assert r.seek("a", 10) == Seek("a", 10)  # even to where it already was (6c93415)
    assert r.fetched(token, "a", 10) == Seek("a", 10)
    assert r.fetched(r.poll(), "a", 10) == 10


def test_a_seek_wins_over_a_hand_in_progress() -> None:
    r = reader("a")
    token = r.poll()
    assert r.piece(token, "a", 10, 12) == Hand("a", 10, 12)
    r.seek("a", 40)
    assert r.piece(token, "a", 12, 14) is None  # the consumer is already at 40
    assert r.not_handed(token, "a", 12) is None
    assert r.position("a") == 40


def test_a_pause_puts_back_what_was_not_handed() -> None:
    r = reader("a")
    token = r.poll()
    r.pause("a")
    assert r.fetched(token, "a", 10) == Seek("a", 10)
    r.resume("a")
    token = r.poll()
    assert r.piece(token, "a", 10, 12) == Hand("a", 10, 12)
    r.pause("a")
    assert r.piece(token, "a", 12, 14) == Seek("a", 12)
    assert r.position("a") == 12


def test_a_piece_not_handed_is_read_again() -> None:
    r = reader("a")
    token = r.poll()
    r.piece(token, "a", 10, 12)
    assert r.not_handed(token, "a", 10) == Seek("a", 10)
    assert r.position("a") == 10


def test_a_failed_poll_puts_every_split_with_a_position_back() -> None:
    r = reader("a", "b")
    r.assign(["a", "b", "c"])
    assert r.poll_failed() == [Seek("a", 10), Seek("b", 10)]


def test_records_of_a_split_no_longer_ours_are_ignored() -> None:
    r = reader("a")
    token = r.poll()
    r.assign([])
    assert r.fetched(token, "a", 10) is None and r.piece(token, "a", 10, 11) is None


def test_a_poll_past_markers_alone_hands_an_empty_piece_up_to_the_consumer() -> None:
    r = reader("a", "b")
    token = r.poll()  # offsets 10..12 of "a": an aborted transaction and its marker
    assert r.skipped(token, "a", 13) == Hand("a", 10, 13)
    assert r.position("a") == 13
    assert r.skipped(token, "b", 10) is None  # nothing moved
    assert r.skipped(token, "b", None) is None  # no position yet
    r.seek("b", 20)
    assert r.skipped(token, "b", 22) == Seek("b", 20)  # sought meanwhile: put back
    token = r.poll()
    r.pause("a")
    assert r.skipped(token, "a", 15) == Seek("a", 13)  # paused meanwhile: put back


def test_a_split_dropped_and_assigned_again_ignores_a_poll_from_before() -> None:
    r = reader("a")
    token = r.poll()
    r.assign([])
    r.assign(["a"])
    r.seek("a", 10)
    r.resume("a")
    assert r.fetched(token, "a", 10) == Seek("a", 10)


# -- the property ------------------------------------------------------------------------------

KEYS = ("s0", "s1", "s2")


class Consumer:
    """aiokafka's rules as the reader meets them: assign() forgets positions and pause
    flags; a fetch is delivered only if the position is still where it started, and then
    moves the position past it (and past markers after it, up to the log's end: a fetch of
    markers alone moves it and delivers nothing); seeking an unassigned partition is an
    error."""

    def __init__(self, logs: dict[str, list[int]], high: dict[str, int]) -> None:
        self.logs, self.high = logs, high
        self.assigned: set[str] = set()
        self.paused: set[str] = set()
        self.position: dict[str, int | None] = {}

    def assign(self, keys: tuple[str, ...]) -> None:
        self.assigned = set(keys)
        self.paused = set()
        self.position = {k: None for k in keys}

    def seek(self, s: Seek | None) -> None:
        if s is not None:
            assert s.key in self.assigned, f"seek on an unassigned split {s}"
            self.position[s.key] = s.offset

    def fetch(self, size: int) -> dict[str, tuple[int, list[int]]]:
        out = {}
        for key in sorted(self.assigned - self.paused):
            at = self.position[key]
            if at is not None and at < self.high[key]:
                out[key] = (at, [o for o in self.logs[key] if o >= at][:size])
        return out

    def deliver(
        self, fetch: dict[str, tuple[int, list[int]]], skip_markers: bool
    ) -> dict[str, list[int]]:
        out = {}
        for key, (at, records) in fetch.items():
            if key in self.assigned and self.position[key] == at:
                last = records[-1] if records else at - 1
                after = [o for o in self.logs[key] if o > last]
                if skip_markers or not records:
                    self.position[key] = after[0] if after else self.high[key]
                else:
                    self.position[key] = last + 1
                if records:
                    out[key] = records
        return out


class Participant:
    """Where it believes its split is, and what it accepted in this round."""

    def __init__(self) -> None:
        self.expected: int | None = None
        self.accepted: set[int] = set()


class World:
    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.logs = {
            k: sorted(data.draw(st.sets(st.integers(0, 24), min_size=2, max_size=15), label=k))
            for k in KEYS
        }
        # a log may end in commit markers or an aborted transaction: no record up to its end
        self.high = {
            k: (log[-1] + 1 if log else 0) + data.draw(st.integers(0, 2), label=f"{k} tail")
            for k, log in self.logs.items()
        }
        self.consumer = Consumer(self.logs, self.high)
        self.model = ReaderPositions()
        self.participants = {k: Participant() for k in KEYS}
        self.in_flight: tuple[PollToken, dict[str, tuple[int, list[int]]]] | None = None
        self.handed = 0

    def draw(self, strategy: st.SearchStrategy[Any]) -> Any:
        return self.data.draw(strategy)

    # -- the participants' and enumerator's calls ------------------------------------------

    def assign(self, wanted: set[str]) -> None:
        plan = self.model.assign(wanted)
        self.consumer.assign(plan.splits)
        self.consumer.paused |= set(plan.pause)
        for s in plan.seek:
            self.consumer.seek(s)
        for key in plan.added:  # reader_attached: where to start, and whether to read
            p = self.participants[key]
            if p.expected is not None:
                self.seek(key, p.expected)
                if self.draw(st.booleans()):
                    self.resume(key)

    def seek(self, key: str, offset: int) -> None:
        p = self.participants[key]
        if self.model.owns(key):  # a participant seeks only a split the reader holds
            p.expected, p.accepted = offset, set()  # a new round
            self.consumer.seek(self.model.seek(key, offset))

    def pause(self, key: str) -> None:
        if self.model.pause(key):
            self.consumer.paused.add(key)

    def resume(self, key: str) -> None:
        if self.participants[key].expected is not None and self.model.resume(key):
            self.consumer.paused.discard(key)

    def interfere(self) -> None:
        """Whatever may arrive while the reader awaits."""
        what = self.draw(st.sampled_from(["none", "none", "none", "seek", "reseek", "pause"]))
        key = self.draw(st.sampled_from(KEYS))
        if what == "seek":
            self.seek(key, self.draw(st.integers(0, self.high[key])))
        elif what == "reseek" and self.participants[key].expected is not None:
            self.seek(key, self.participants[key].expected)  # the same offset again
        elif what == "pause":
            self.pause(key)

    # -- the poll loop ---------------------------------------------------------------------

    def poll(self) -> None:
        if self.in_flight is None and self.model.any_resumed:
            size = self.draw(st.integers(1, 6))
            self.in_flight = (self.model.poll(), self.consumer.fetch(size))

    def deliver(self, quiet: bool = False) -> None:
        if self.in_flight is None:
            return
        token, fetch = self.in_flight
        self.in_flight = None
        delivered = self.consumer.deliver(fetch, self.draw(st.booleans()))
        if not quiet and self.draw(st.integers(0, 9)) == 0:  # the poll fails as a whole
            for s in self.model.poll_failed():
                self.consumer.seek(s)
            return
        fetched_to = dict(self.consumer.position)
        for key, records in delivered.items():
            if not self.model.owns(key):
                continue
            first = self.model.fetched(token, key, records[0])
            if not isinstance(first, int):
                self.consumer.seek(first)
                continue
            self.hand(token, key, records, first, fetched_to[key], quiet)
        for key in self.model.resumed:  # moved past markers alone: an empty piece
            if key not in delivered:
                moved = self.model.skipped(token, key, self.consumer.position[key])
                if isinstance(moved, Hand):
                    self.receive(moved, [])
                else:
                    self.consumer.seek(moved)

    def hand(
        self,
        token: PollToken,
        key: str,
        records: list[int],
        first: int,
        fetched_to: int | None,
        quiet: bool,
    ) -> None:
        size = 2  # max_poll_records
        for start in range(0, len(records), size):
            piece = records[start : start + size]
            if not quiet:
                self.interfere()
            stop = piece[-1] + 1
            if start + size >= len(records):  # the last piece: to where the consumer stands
                stop = max(stop, fetched_to or 0)
            decision = self.model.piece(token, key, first, stop)
            if not isinstance(decision, Hand):
                self.consumer.seek(decision)
                return
            if not quiet and self.draw(st.integers(0, 7)) == 0:  # the Ray call fails
                self.interfere()
                self.consumer.seek(self.model.not_handed(token, key, first))
                return
            self.receive(decision, piece)
            first = decision.stop

    def receive(self, hand: Hand, piece: list[int]) -> None:
        """What the participant checks: the batch starts where it is (a seek always wins,
        nothing stale arrives), covers every record from there (no gap), and holds none
        it accepted in this round (nothing twice)."""
        p = self.participants[hand.key]
        assert hand.first == p.expected, (hand, p.expected)
        log = self.logs[hand.key]
        assert [o for o in log if hand.first <= o < hand.stop] == piece, (hand, piece)
        assert not p.accepted & set(piece), (hand, p.accepted)
        p.accepted |= set(piece)
        p.expected = hand.stop
        self.handed += 1

    def check_consumer(self) -> None:
        """The consumer stands where the model says each split is, or past markers only."""
        for key in self.model.splits:
            at, pos = self.model.position(key), self.consumer.position[key]
            if at is not None:
                assert pos is not None and pos >= at, (key, at, pos)
                assert not [o for o in self.logs[key] if at <= o < pos], (key, at, pos)


STEPS = ("poll",) * 3 + ("deliver",) * 3 + ("seek", "reseek", "pause", "resume", "assign")


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_runs_hand_each_record_once_per_round_without_gaps_and_never_stall(
    data: st.DataObject,
) -> None:
    world = World(data)
    world.assign(set(KEYS))
    for key in KEYS:  # the usual start: each participant seeks its split and resumes it
        world.seek(key, data.draw(st.integers(0, world.high[key])))
        world.resume(key)
    for _ in range(data.draw(st.integers(10, 60))):
        step = data.draw(st.sampled_from(STEPS))
        key = data.draw(st.sampled_from(KEYS))
        if step == "poll":
            world.poll()
        elif step == "deliver":
            world.deliver()
        elif step == "seek":
            world.seek(key, data.draw(st.integers(0, world.high[key])))
        elif step == "reseek" and world.participants[key].expected is not None:
            world.seek(key, world.participants[key].expected)
        elif step == "pause":
            world.pause(key)
        elif step == "resume":
            world.resume(key)
        elif step == "assign":
            world.assign(set(data.draw(st.lists(st.sampled_from(KEYS)))))
        if world.in_flight is None:
            world.check_consumer()
    # Then leave it alone: every resumed split with a participant position reads to the end.
    world.deliver(quiet=True)
    world.check_consumer()
    live = [k for k in world.model.splits if world.participants[k].expected is not None]
    for key in live:
        world.resume(key)
    random_hands = world.handed
    for _ in range(30):
        world.poll()
        if world.in_flight is None:
            break
        empty = not world.in_flight[1]
        # an empty poll is delivered too: the reader hands what every poll moved past
        # (``skipped``) - a split paused while a poll moved its consumer over markers
        world.deliver(quiet=True)
        if empty:
            break
    for key in live:
        assert world.participants[key].expected == world.high[key], (key, world.high[key])
    event(f"hands while disturbed: {min(random_hands, 5)}")
