"""The give-up decision, pure: time is an input, so every boundary is exact."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayconnect.protocol.outages import DEFAULT_GIVE_UP_AFTER_S, OutageWatch

BROKER, TABLE = "broker local (reader local/0)", "table store"


def test_waits_out_an_outage_shorter_than_the_limit_and_gives_up_at_it() -> None:
    w = OutageWatch(60)
    w.failing(BROKER, "refused", now=100)
    assert w.decide(now=159.9) is None
    decision = w.decide(now=160)
    assert decision is not None
    assert decision.outage.what == BROKER and decision.lasted_s == 60
    assert decision.reason == (
        f"gave up: {BROKER} failing for 60 s without a break (give_up_after_s=60): refused"
    )


def test_a_break_starts_the_clock_again() -> None:
    w = OutageWatch(60)
    w.failing(TABLE, "503", now=0)
    w.failing(TABLE, "503 again", now=50)  # the same outage: it began at 0
    assert w.outages[0].since == 0 and w.outages[0].reason == "503 again"
    w.fine(TABLE)
    w.failing(TABLE, "503", now=55)
    assert w.decide(now=114) is None
    assert w.decide(now=115) is not None


def test_the_observers_since_counts_not_when_it_was_reported() -> None:
    """A reader reports every probe; a restarted coordinator first hears of an outage that
    began long ago - the reader's ``since`` is what counts."""
    w = OutageWatch(60)
    w.failing(BROKER, "refused", now=100, since=30)
    assert w.decide(now=100) is not None
    w2 = OutageWatch(60)
    w2.failing(BROKER, "refused", now=10, since=10)
    w2.failing(BROKER, "refused", now=12, since=5)  # an earlier start is believed
    assert w2.outages[0].since == 5


def test_the_oldest_of_several_outages_decides_and_each_ends_on_its_own() -> None:
    w = OutageWatch(60)
    w.failing(TABLE, "503", now=10)
    w.failing(BROKER, "refused", now=0)
    assert [o.what for o in w.outages] == [BROKER, TABLE]
    w.fine(BROKER)
    assert w.decide(now=65) is None  # the table's began at 10
    assert w.decide(now=70).outage.what == TABLE  # type: ignore[union-attr]


def test_once_given_up_it_stays_given_up() -> None:
    w = OutageWatch(1)
    w.failing(TABLE, "503", now=0)
    first = w.decide(now=5)
    w.fine(TABLE)
    assert w.decide(now=6) == first == w.gave_up


def test_none_never_gives_up_but_keeps_the_outages_for_status() -> None:
    w = OutageWatch(None)
    w.failing(TABLE, "503", now=0)
    assert w.decide(now=1e9) is None
    assert w.describe(now=12) == [f"{TABLE} failing for 12 s: 503"]


def test_unknown_fine_is_harmless_and_bad_limits_are_refused() -> None:
    OutageWatch().fine("nothing")
    assert OutageWatch().give_up_after_s == DEFAULT_GIVE_UP_AFTER_S
    with pytest.raises(ValueError, match="give_up_after_s"):
        OutageWatch(0)


@given(
    st.lists(
        st.tuples(st.sampled_from([BROKER, TABLE]), st.booleans(), st.floats(0, 10)),
        max_size=40,
    )
)
def test_gives_up_exactly_when_some_outage_has_lasted_the_limit(steps) -> None:
    """Against a model: per name, the time of the first failure since its last fine."""
    limit, now, w = 30.0, 0.0, OutageWatch(30.0)
    began: dict[str, float] = {}
    gave_up = False
    for what, failing, dt in steps:
        now += dt
        if failing:
            w.failing(what, "x", now)
            began.setdefault(what, now)
        else:
            w.fine(what)
            began.pop(what, None)
        expected = gave_up or any(now - t >= limit for t in began.values())
        assert (w.decide(now) is not None) == expected
        gave_up = expected
