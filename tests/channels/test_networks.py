"""Networks as channels: Wi-Fi, cellular data and SMS, the thesis' waiting example, and
the properties every decision keeps (no hold past the deadline, no limit exceeded)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mdeci.channels import (
    CHEAPEST,
    Channel,
    ClassPolicy,
    Kind,
    Limit,
    MemoryUsage,
    Outgoing,
    Period,
    PolicyError,
    Rule,
    SendNow,
    Tariff,
    Usage,
    WeeklyCalendar,
    Weights,
    period_days,
    record_send,
    select,
)
from mdeci.channels.networks import (
    MB,
    THESIS_NETWORKS,
    Best,
    BySms,
    Deliver,
    DeviceReport,
    Network,
    Queue,
    Wait,
    battery_weights,
    decide,
    network_policy,
    released,
)

T0 = datetime(2025, 1, 15, 12, tzinfo=UTC).timestamp()  # a Wednesday, noon UTC
CLASSES = {
    "urgent": ClassPolicy(kinds=frozenset({Kind.IP, Kind.SMS})),
    "normal": ClassPolicy(),
    "bulk": ClassPolicy(weights=CHEAPEST, max_delay=600.0),
}
SMS_CHANNEL = Channel(
    name="sms", kind=Kind.SMS, tariff=Tariff(price=0.0015), energy_mw=600, latency_ms=10_000
)


def _msg(qclass: str, size: int = 512, first_seen: float = T0) -> Outgoing:
    return Outgoing(user="alice", qclass=qclass, size=size, first_seen=first_seen)


def test_thesis_waiting_example_bulk_waits_for_wifi_urgent_goes_now() -> None:
    # "In 10 minutes the MH will arrive at its destination where WiFi is available":
    # the calendar gives Wi-Fi p = 0.9; bulk (Dmax 10 min) waits 9 minutes, then goes.
    policy = network_policy(THESIS_NETWORKS, CLASSES, report=DeviceReport(network="cellular"))
    calendar = WeeklyCalendar.constant({"wifi": 0.9})
    usage = MemoryUsage()
    bulk = decide(
        policy, _msg("bulk"), network="cellular", sms=False, usage=usage, now=T0, calendar=calendar
    )
    assert isinstance(bulk, Wait)
    assert bulk.waiting_for == ("wifi",)
    assert bulk.until == pytest.approx(T0 + 540.0)
    assert bulk.deadline == pytest.approx(T0 + 600.0)
    urgent = decide(
        policy, _msg("urgent"), network="cellular", sms=False, usage=usage, now=T0,
        calendar=calendar,
    )  # fmt: skip
    assert urgent == Deliver("cellular", urgent.score, urgent.cost)  # type: ignore[union-attr]
    assert isinstance(urgent, Deliver) and urgent.cost == pytest.approx(512 / MB * 30 / 6144)

    # The device reaches Wi-Fi after 2 minutes: released at once, delivered on Wi-Fi.
    assert released(bulk, "wifi", T0 + 120)
    again = decide(
        policy, _msg("bulk"), network="wifi", sms=False, usage=usage, now=T0 + 120,
        calendar=calendar,
    )  # fmt: skip
    assert isinstance(again, Deliver) and again.network == "wifi" and again.cost == 0.0

    # Still on cellular at 8:59 it waits; at 9:00 the deadline makes cellular best.
    assert not released(bulk, "cellular", T0 + 539)
    assert isinstance(
        decide(policy, _msg("bulk"), network="cellular", sms=False, usage=usage,
               now=T0 + 539, calendar=calendar),
        Wait,
    )  # fmt: skip
    assert released(bulk, "cellular", T0 + 540)
    late = decide(
        policy, _msg("bulk"), network="cellular", sms=False, usage=usage, now=T0 + 540,
        calendar=calendar,
    )  # fmt: skip
    assert isinstance(late, Deliver) and late.network == "cellular"


def test_without_calendar_or_on_the_cheap_network_nothing_waits() -> None:
    policy = network_policy(THESIS_NETWORKS, CLASSES)
    usage = MemoryUsage()
    no_cal = decide(policy, _msg("bulk"), network="cellular", sms=False, usage=usage, now=T0)
    assert isinstance(no_cal, Deliver) and no_cal.network == "cellular"
    cal = WeeklyCalendar.constant({"wifi": 0.9})
    on_wifi = decide(
        policy, _msg("bulk"), network="wifi", sms=False, usage=usage, now=T0, calendar=cal
    )
    assert isinstance(on_wifi, Deliver) and on_wifi.network == "wifi"


def test_sms_only_when_configured_and_allowed() -> None:
    with_sms = network_policy(THESIS_NETWORKS, CLASSES, sms=SMS_CHANNEL)
    without = network_policy(THESIS_NETWORKS, CLASSES)
    usage = MemoryUsage()
    # No network: urgent goes by SMS where SMS is a channel, waits in the queue otherwise.
    assert isinstance(
        decide(with_sms, _msg("urgent"), network=None, sms=True, usage=usage, now=T0), BySms
    )
    assert isinstance(
        decide(without, _msg("urgent"), network=None, sms=True, usage=usage, now=T0), Queue
    )
    # normal may not use SMS at all.
    assert isinstance(
        decide(with_sms, _msg("normal"), network=None, sms=True, usage=usage, now=T0), Queue
    )
    # SMS configured but not usable now (no number, gateway down): not a channel now.
    assert isinstance(
        decide(with_sms, _msg("urgent"), network=None, sms=False, usage=usage, now=T0), Queue
    )


def test_device_best_values_and_unknown_network() -> None:
    report = DeviceReport(network="ethernet", best={"wifi": Best(latency_ms=5, coverage=0.5)})
    policy = network_policy(THESIS_NETWORKS, CLASSES, report=report)
    wifi = next(c for c in policy.channels if c.name == "wifi")
    assert (wifi.latency_ms, wifi.coverage) == (5, 0.5)
    assert [c.name for c in policy.channels] == ["wifi", "cellular", "ethernet"]
    got = decide(policy, _msg("normal"), network="ethernet", sms=False, usage=MemoryUsage(), now=T0)
    assert isinstance(got, Deliver) and got.network == "ethernet"


def test_low_battery_raises_the_energy_weight() -> None:
    assert battery_weights(CHEAPEST, None) == CHEAPEST
    assert battery_weights(CHEAPEST, 0.5) == CHEAPEST
    empty = battery_weights(CHEAPEST, 0.0)
    assert empty.energy == pytest.approx(0.5) and empty.cost == pytest.approx(0.5)
    half = battery_weights(Weights(), 0.1)  # half way to empty below 0.2
    assert half.energy > 0.25 and half.cost == pytest.approx(half.latency)
    # Normal class, equal weights: full battery prefers Wi-Fi over a cheap, low-power
    # cellular network only by cost; an empty battery chooses the low-power one.
    nets = (
        Network(kind="wifi", price_per_mb=0.0, energy_mw=2000, latency_ms=50),
        Network(kind="cellular", price_per_mb=0.01, energy_mw=1, latency_ms=50),
    )
    for battery, want in ((1.0, "wifi"), (0.0, "cellular")):
        policy = network_policy(
            nets, {"normal": ClassPolicy()}, report=DeviceReport(battery=battery)
        )
        got = select(
            policy, _msg("normal"), available={"wifi", "cellular"}, usage=MemoryUsage(), now=T0
        )
        assert got.channel.name == want, battery  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "sms"}, "'sms' is not a network kind"),
        ({"kind": "wi fi"}, "letters, digits"),
        ({"kind": "wifi", "price_per_mb": -1.0}, "price_per_mb"),
        ({"kind": "wifi", "coverage": 0.0}, "coverage"),
        ({"kind": "wifi", "energy_mw": 0.0}, "energy_mw"),
    ],
)
def test_bad_network_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Network(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- properties

_KINDS = ("wifi", "cellular", "sat")
_prob = st.floats(min_value=0.0, max_value=1.0)


@st.composite
def _networks(draw: st.DrawFn) -> tuple[Network, ...]:
    count = draw(st.integers(min_value=1, max_value=3))
    return tuple(
        Network(
            kind=_KINDS[i],
            price_per_mb=draw(st.sampled_from([0.0, 0.001, 0.005, 1.0, 20.0])),
            energy_mw=draw(st.floats(min_value=1, max_value=3000)),
            latency_ms=draw(st.floats(min_value=1, max_value=20000)),
            coverage=draw(st.floats(min_value=0.01, max_value=1.0)),
        )
        for i in range(count)
    )


@st.composite
def _weights(draw: st.DrawFn) -> Weights:
    raw = [draw(st.integers(min_value=0, max_value=4)) for _ in range(4)]
    if not any(raw):
        raw[0] = 1
    total = sum(raw)
    return Weights(
        cost=raw[0] / total, energy=raw[1] / total, latency=raw[2] / total, coverage=raw[3] / total
    )


@st.composite
def _limits(draw: st.DrawFn, channels: tuple[str, ...]) -> tuple[Limit, ...]:
    out = []
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        which = draw(st.sampled_from(("messages", "bytes", "money")))
        bound: dict[str, float | int] = {
            "messages": draw(st.integers(min_value=0, max_value=5)),
            "bytes": draw(st.integers(min_value=0, max_value=5000)),
            "money": draw(st.sampled_from([0.0, 1e-6, 0.002, 0.01])),
        }
        out.append(
            Limit(
                period=draw(st.sampled_from(list(Period))),
                channel=draw(st.sampled_from((None, *channels))),
                qclass=draw(st.sampled_from((None, "urgent", "bulk", "x"))),
                **{which: bound[which]},  # type: ignore[arg-type]
            )
        )
    return tuple(out)


@st.composite
def _calendars(draw: st.DrawFn) -> WeeklyCalendar:
    """Constant, hourly or dated (a network coming within the test's hours, or not)."""
    if draw(st.booleans()):
        return WeeklyCalendar.constant({k: draw(_prob) for k in _KINDS})
    rules: list[Rule] = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind, p = draw(st.sampled_from(_KINDS)), draw(_prob)
        if draw(st.booleans()):
            start = T0 + draw(st.floats(min_value=-3600, max_value=10_000))
            rules.append(
                Rule(channel=kind, p=p, start_at=start, end_at=start + draw(st.floats(1, 9000)))
            )
        else:
            first = draw(st.integers(min_value=0, max_value=23))
            rules.append(Rule(channel=kind, p=p, start_hour=first, end_hour=first + 1))
    return WeeklyCalendar.from_rules(rules)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_decisions_keep_deadline_and_limits(data: st.DataObject) -> None:
    networks = data.draw(_networks())
    with_sms = data.draw(st.booleans())
    names = tuple(n.kind for n in networks) + (("sms",) if with_sms else ())
    classes = {
        "urgent": ClassPolicy(
            weights=data.draw(_weights()), kinds=frozenset({Kind.IP, Kind.SMS}), max_delay=0.0
        ),
        "bulk": ClassPolicy(
            weights=data.draw(_weights()),
            kinds=frozenset({Kind.IP, Kind.SMS})
            if data.draw(st.booleans())
            else frozenset({Kind.IP}),
            max_delay=data.draw(st.floats(min_value=0, max_value=7200)),
        ),
        "x": ClassPolicy(weights=data.draw(_weights()), max_delay=data.draw(st.floats(0, 60))),
    }
    report = DeviceReport(
        network=data.draw(st.sampled_from((None, *_KINDS[: len(networks)]))),
        battery=data.draw(st.one_of(st.none(), _prob)),
    )
    limits = data.draw(_limits(names))
    policy = network_policy(
        networks, classes, report=report, sms=SMS_CHANNEL if with_sms else None, limits=limits
    )
    calendar = data.draw(_calendars())
    usage = MemoryUsage()
    for _ in range(data.draw(st.integers(min_value=0, max_value=4))):  # earlier sends
        channel = data.draw(st.sampled_from(names))
        sent_class = data.draw(st.sampled_from(("urgent", "bulk")))
        money = data.draw(st.sampled_from([0.0, 0.001]))
        usage.add(
            "alice", channel, sent_class, T0 - 10, Usage(1, data.draw(st.integers(0, 2000)), money)
        )
    qclass = data.draw(st.sampled_from(("urgent", "bulk", "x")))
    message = _msg(qclass, size=data.draw(st.integers(min_value=1, max_value=3000)))
    now = T0 + data.draw(st.one_of(st.just(0.0), st.floats(min_value=0, max_value=10_000)))
    decision = decide(
        policy, message, network=report.network, sms=with_sms, usage=usage, now=now,
        calendar=calendar,
    )  # fmt: skip
    event(type(decision).__name__)
    deadline = message.first_seen + classes[qclass].max_delay
    if isinstance(decision, Wait):
        assert classes[qclass].max_delay > 0  # urgent never waits
        assert now < decision.until <= deadline + 1e-6
        assert decision.deadline == deadline
        assert report.network not in decision.waiting_for
    if now >= deadline:
        assert not isinstance(decision, Wait)
    if isinstance(decision, Deliver | BySms):
        channel = decision.network if isinstance(decision, Deliver) else "sms"
        assert channel in names or channel == report.network
        if isinstance(decision, Deliver):
            assert channel == report.network
        else:
            assert with_sms
        # Counting the send keeps every applicable limit within its bound.
        chosen = next(c for c in policy.channels if c.name == channel)
        sent = select(
            policy, message, available={channel}, usage=usage, now=now
        )  # the same ranking on that channel alone
        assert isinstance(sent, SendNow) and sent.channel == chosen
        record_send(usage, message, sent, at=now)
        for limit in limits:
            if not limit.applies(chosen.name, qclass):
                continue
            first, end = period_days(limit.period, now)
            used = usage.usage("alice", first, end, channel=limit.channel, qclass=limit.qclass)
            assert limit.messages is None or used.messages <= limit.messages
            assert limit.bytes is None or used.bytes <= limit.bytes
            assert limit.money is None or used.money <= limit.money + 1e-9
