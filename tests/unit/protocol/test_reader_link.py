"""A participant's steering that misses its reader: found again, and steered to what the
participant wants by then (protocol/reader_link.py through protocol/participant.py)."""

from __future__ import annotations

import pytest

from rayconnect.protocol.effects import FindReader, Pause, Resume, Seek
from rayconnect.protocol.errors import ProtocolError
from rayconnect.protocol.messages import EndCommit, StartCommit
from rayconnect.protocol.participant import Participant
from rayconnect.protocol.reader_link import TRANSITIONS, LinkEvent, LinkState
from rayconnect.protocol.settings import CommitSettings

KEY = "c1/t/0"
CFG = CommitSettings(flush_max_records=10, flush_max_bytes=1000, flush_max_age_s=5.0)


def test_a_lost_seek_is_carried_out_again_to_where_the_participant_is_by_then() -> None:
    p = Participant(KEY, CFG)
    assert p.step(StartCommit(1, 1, {KEY: 100}), now=0.0) == [Seek(100), Resume()]
    assert p.reader_lost(now=0.5) == []  # the host found no reader for the Seek
    assert (p.reader_synced, p.next_deadline()) == (False, 0.5)
    assert p.tick(1.0) == [FindReader()]
    assert p.tick(1.2) == []  # one lookup at a time
    p.records(100, 103, 3, 30, "b", now=1.3)  # a reader that attached meanwhile read on
    assert p.reader_found(now=1.5) == [Seek(103), Resume()]  # where it wants the reader now
    assert p.reader_synced and p.status().reader == "synced"


def test_a_lookup_that_finds_nothing_is_asked_again_by_a_later_tick() -> None:
    p = Participant(KEY, CFG)
    p.reader_lost(now=0.0)
    assert p.tick(0.0) == [FindReader()] and p.status().reader == "finding"
    assert p.reader_not_found(now=1.0) == []
    assert p.next_deadline() == 1.0
    assert p.tick(1.25) == [FindReader()]
    p.step(StartCommit(1, 1, {KEY: 7}), now=1.3)
    assert p.reader_found(now=2.0) == [Seek(7), Resume()]
    p.reader_lost(now=3.0)
    p.step(StartCommit(1, 2, {}), now=3.1)  # by the policy: the start is not known yet
    p.step(EndCommit(1, 2), now=3.2)  # so nothing to read ahead from: paused
    assert p.tick(3.5) == [FindReader()]
    assert p.reader_found(now=4.0) == [Pause()]


def test_a_reader_that_attaches_answers_the_doubt_and_late_lookups_are_ignored() -> None:
    p = Participant(KEY, CFG)
    p.step(StartCommit(1, 1, {KEY: 100}), now=0.0)
    p.reader_lost(now=0.0)
    assert p.tick(0.5) == [FindReader()]
    assert p.reader_attached(now=0.6) == [Seek(100), Resume()]
    assert p.reader_synced and p.next_deadline() is None
    assert p.reader_found(now=0.7) == []  # the lookup's answer came after the reader
    fresh = Participant("c1/t/1", CFG)
    assert fresh.reader_attached(now=0.0) == []  # nowhere to go yet: the split stays paused


def test_a_lookup_answer_without_a_lookup_is_a_bug() -> None:
    with pytest.raises(ProtocolError):
        TRANSITIONS.move(LinkState.SYNCED, LinkEvent.FIND)
    with pytest.raises(ProtocolError):
        TRANSITIONS.move(LinkState.FINDING, LinkEvent.FIND)
