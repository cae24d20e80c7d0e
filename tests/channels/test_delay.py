"""Delay tolerance: hold up to D = P * Dmax for a better channel, on a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.channels import (
    CHEAPEST,
    Channel,
    ClassPolicy,
    Hold,
    HoldQueue,
    MemoryUsage,
    NoChannel,
    Outgoing,
    PolicyError,
    Rule,
    SelectorPolicy,
    SendNow,
    Tariff,
    WeeklyCalendar,
    select,
)

T0 = datetime(2025, 1, 15, 12, tzinfo=UTC).timestamp()  # a Wednesday, noon UTC
WIFI = Channel(name="wifi", tariff=Tariff(price=0.0), latency_ms=20)
MNO = Channel(name="mno", tariff=Tariff(price=0.01), latency_ms=250)
POLICY = SelectorPolicy(
    channels=(WIFI, MNO),
    classes={
        "bulk": ClassPolicy(weights=CHEAPEST, max_delay=600.0),
        "normal": ClassPolicy(weights=CHEAPEST),
    },
)
CAL = WeeklyCalendar.constant({"wifi": 0.9})


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def _msg(qclass: str = "bulk") -> Outgoing:
    return Outgoing(user="u", qclass=qclass, size=300, first_seen=T0)


def test_holds_nine_minutes_then_sends_on_what_is_there() -> None:
    clock = FakeClock(T0)
    usage = MemoryUsage()
    queue: HoldQueue[int] = HoldQueue()
    first = select(POLICY, _msg(), available={"mno"}, usage=usage, now=clock.now, calendar=CAL)
    assert isinstance(first, Hold)
    assert first.until == pytest.approx(T0 + 540.0)  # 0.9 * 10 min
    assert first.waiting_for == ("wifi",)
    queue.hold(7, _msg(), first)
    assert queue.next_deadline() == pytest.approx(T0 + 540.0)

    for _ in range(8):  # 8 minutes: still held
        clock.advance(60)
        assert (
            queue.reconsider(POLICY, available={"mno"}, usage=usage, now=clock.now, calendar=CAL)
            == []
        )
    clock.advance(59.999)  # 8:59.999
    assert (
        queue.reconsider(POLICY, available={"mno"}, usage=usage, now=clock.now, calendar=CAL) == []
    )
    assert len(queue) == 1
    clock.advance(0.001)  # 9:00: the delay ran out, send on MNO, which is there
    released = queue.reconsider(POLICY, available={"mno"}, usage=usage, now=clock.now, calendar=CAL)
    assert len(released) == 1
    key, _, decision = released[0]
    assert key == 7 and isinstance(decision, SendNow) and decision.channel.name == "mno"
    assert len(queue) == 0 and queue.next_deadline() is None


def test_released_at_once_when_the_better_channel_appears() -> None:
    usage = MemoryUsage()
    queue: HoldQueue[str] = HoldQueue()
    held = select(POLICY, _msg(), available={"mno"}, usage=usage, now=T0, calendar=CAL)
    assert isinstance(held, Hold)
    queue.hold("n1", _msg(), held)
    released = queue.reconsider(
        POLICY, available={"mno", "wifi"}, usage=usage, now=T0 + 120, calendar=CAL
    )
    assert [(k, d.channel.name) for k, _, d in released if isinstance(d, SendNow)] == [
        ("n1", "wifi")
    ]


def test_no_hold_when_best_is_there_or_class_is_not_tolerant_or_p_is_zero() -> None:
    usage = MemoryUsage()
    d = select(POLICY, _msg(), available={"mno", "wifi"}, usage=usage, now=T0, calendar=CAL)
    assert isinstance(d, SendNow) and d.channel.name == "wifi"
    d = select(POLICY, _msg("normal"), available={"mno"}, usage=usage, now=T0, calendar=CAL)
    assert isinstance(d, SendNow) and d.channel.name == "mno"
    never = WeeklyCalendar.constant({"wifi": 0.0})
    d = select(POLICY, _msg(), available={"mno"}, usage=usage, now=T0, calendar=never)
    assert isinstance(d, SendNow) and d.channel.name == "mno"
    d = select(POLICY, _msg(), available=set(), usage=usage, now=T0, calendar=CAL)
    assert isinstance(d, NoChannel)


def test_calendar_rules_by_weekday_and_hour_in_local_time() -> None:
    # Wi-Fi at home, weekday evenings 18-24 local (UTC-3), weekends all day.
    cal = WeeklyCalendar.from_rules(
        [
            Rule(channel="wifi", p=0.8, weekdays=frozenset(range(5)), start_hour=18),
            Rule(channel="wifi", p=0.95, weekdays=frozenset({5, 6})),
            Rule(channel="lan", p=0.5, weekdays=frozenset({2}), start_hour=9, end_hour=10),
        ],
        utc_offset_minutes=-180,
    )
    wed_21_utc = T0 + 9 * 3600  # 21:00 UTC = 18:00 local
    assert cal.probability("wifi", T0) == 0.0  # 09:00 local
    assert cal.probability("wifi", wed_21_utc) == 0.8
    assert cal.probability("wifi", T0 + 3 * 86400) == 0.95  # Saturday
    assert cal.probability("lan", T0) == 0.5
    assert cal.probability("nothing", T0) == 0.0
    assert cal.any_of(["wifi", "lan"], T0) == pytest.approx(0.5)
    assert cal.any_of(["wifi", "lan"], wed_21_utc) == pytest.approx(0.8)
    # P is the highest over [first_seen, first_seen + Dmax): at 09:00 local with only lan
    # likely in the next 10 minutes, D = 0.5 * Dmax.
    policy = SelectorPolicy(
        channels=(Channel(name="lan"), MNO),
        classes={"bulk": ClassPolicy(weights=CHEAPEST, max_delay=600)},
    )
    d = select(policy, _msg(), available={"mno"}, usage=MemoryUsage(), now=T0, calendar=cal)
    assert isinstance(d, Hold) and d.until == pytest.approx(T0 + 300)


def test_bad_calendars_are_refused() -> None:
    with pytest.raises(PolicyError):
        WeeklyCalendar(slots={"wifi": (0.5,) * 10})
    with pytest.raises(PolicyError):
        WeeklyCalendar.constant({"wifi": 1.5})
    with pytest.raises(PolicyError):
        WeeklyCalendar(slot_minutes=11)


def _dated(channel: str, p: float, start: float, end: float) -> Rule:
    return Rule(channel=channel, p=p, start_at=start, end_at=end)


def test_the_thesis_example_wifi_in_ten_minutes() -> None:
    # "In 10 minutes the MH will arrive at its destination where WiFi is available": the
    # calendar has Wi-Fi only from then, so P is 0 at first_seen and 1 within Dmax.
    policy = SelectorPolicy(
        channels=(WIFI, MNO), classes={"bulk": ClassPolicy(weights=CHEAPEST, max_delay=1800)}
    )
    cal = WeeklyCalendar.from_rules([_dated("wifi", 1.0, T0 + 600, T0 + 7200)])
    assert cal.probability("wifi", T0) == 0.0
    assert cal.probability("wifi", T0 + 600) == 1.0
    assert cal.probability("wifi", T0 + 7200) == 0.0
    usage = MemoryUsage()
    d = select(policy, _msg(), available={"mno"}, usage=usage, now=T0, calendar=cal)
    assert isinstance(d, Hold) and d.p == 1.0 and d.until == pytest.approx(T0 + 1800)
    queue: HoldQueue[int] = HoldQueue()
    queue.hold(1, _msg(), d)
    # It arrives: the held one goes on Wi-Fi at once.
    released = queue.reconsider(
        policy, available={"mno", "wifi"}, usage=usage, now=T0 + 610, calendar=cal
    )
    assert [(k, x.channel.name) for k, _, x in released if isinstance(x, SendNow)] == [(1, "wifi")]
    # Wi-Fi expected only after the deadline: nothing to wait for.
    late = WeeklyCalendar.from_rules([_dated("wifi", 1.0, T0 + 1800, T0 + 7200)])
    d = select(policy, _msg(), available={"mno"}, usage=usage, now=T0, calendar=late)
    assert isinstance(d, SendNow) and d.channel.name == "mno"


def test_a_weekly_slot_ahead_counts_and_dated_rules_override_it() -> None:
    # Wi-Fi from 12:05 local every day (slot 12:00-13:00 starts at 12:00: hourly rules);
    # a message at 11:58 may wait 10 minutes: the 12:00 slot is within them.
    cal = WeeklyCalendar.from_rules([Rule(channel="wifi", p=0.9, start_hour=12, end_hour=13)])
    msg = Outgoing(user="u", qclass="bulk", size=300, first_seen=T0 - 120)
    d = select(POLICY, msg, available={"mno"}, usage=MemoryUsage(), now=T0 - 120, calendar=cal)
    assert isinstance(d, Hold) and d.until == pytest.approx(T0 - 120 + 540)
    # A dated rule saying no Wi-Fi today from 11:00 to 14:00 overrides the weekly one.
    off = WeeklyCalendar.from_rules(
        [
            Rule(channel="wifi", p=0.9, start_hour=12, end_hour=13),
            _dated("wifi", 0.0, T0 - 3600, T0 + 7200),
        ]
    )
    assert off.probability("wifi", T0) == 0.0
    assert off.probability("wifi", T0 + 86400) == 0.9
    d = select(POLICY, msg, available={"mno"}, usage=MemoryUsage(), now=T0 - 120, calendar=off)
    assert isinstance(d, SendNow) and d.channel.name == "mno"


def test_bad_dated_rules_are_refused() -> None:
    with pytest.raises(PolicyError, match="both"):
        Rule(channel="wifi", p=1.0, start_at=T0)
    with pytest.raises(PolicyError, match="end after"):
        _dated("wifi", 1.0, T0, T0)
    with pytest.raises(PolicyError, match="finite"):
        _dated("wifi", 1.0, T0, float("inf"))


_WEEKLY = st.builds(
    lambda ch, p, days, a, b: Rule(
        channel=ch, p=p, weekdays=frozenset(days), start_hour=min(a, b), end_hour=max(a, b)
    ),
    st.sampled_from(("wifi", "lan")),
    st.floats(0, 1),
    st.sets(st.integers(0, 6), min_size=1),
    st.integers(0, 24),
    st.integers(0, 24),
)
_DATED = st.builds(
    lambda ch, p, start, length: _dated(ch, p, T0 + start, T0 + start + length),
    st.sampled_from(("wifi", "lan")),
    st.floats(0, 1),
    st.floats(-7200, 90_000),
    st.floats(1, 20_000),
)


@settings(max_examples=200, deadline=None)
@given(
    rules=st.lists(st.one_of(_WEEKLY, _DATED), max_size=5),
    offset=st.integers(-840, 840),
    start=st.floats(0, 86_400),
    length=st.floats(1, 30_000),
)
def test_likeliest_is_the_highest_any_of_in_the_window(
    rules: list[Rule], offset: int, start: float, length: float
) -> None:
    cal = WeeklyCalendar.from_rules(rules, utc_offset_minutes=offset)
    begin, end = T0 + start, T0 + start + length
    found = cal.likeliest(["wifi", "lan"], begin, end)
    # Every minute of the window, every local hour's start and every rule's edges in it.
    instants = [begin + 60.0 * k for k in range(int(length // 60) + 1)]
    hour = (begin + offset * 60) // 3600 * 3600 - offset * 60
    instants += [hour + 3600.0 * k for k in range(1, int(length // 3600) + 2)]
    instants += [t for r in rules for t in (r.start_at, r.end_at) if t is not None]
    seen = [cal.any_of(["wifi", "lan"], t) for t in instants if begin <= t < end]
    assert found == pytest.approx(max(seen), abs=1e-12)
