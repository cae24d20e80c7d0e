"""The device's calendar reaches the broker (a frame, kept in SQL) and a
delay-tolerant class waits ``D = P * Dmax`` for IP before it pays for SMS.

Class ``bulk`` here may use IP or SMS, cheapest first, Dmax one hour. Alice's calendar
says IP is up with probability 0.5 at every hour: while her IP is cut, a bulk
notification is held for 0.5 h from its publication, then goes by SMS. Without a
calendar (P = 0) it goes by SMS at once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mdeci.channels.config import ChannelsConfig, ClassConfig, default_class_configs
from mdeci.frames import CalendarRule
from mdeci.sms.smsc import SmscConfig
from mdeci.store.calendars import SqlCalendars
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    Deaf,
    Sink,
    guard,
    ip_back,
    network,
    sms_config,
    sms_world,
    until,
)

BULK = ClassConfig(
    name="bulk", wc=1.0, we=0.0, wl=0.0, wv=0.0, channels=("ip", "sms"), max_delay=3600.0
)
CHANNELS = ChannelsConfig(
    default_class="bulk",
    classes=(*[c for c in default_class_configs() if c.name != "bulk"], BULK),
)


def _sms_queued(sink: Sink, nseq: int) -> list[str]:
    return [
        str(e.fields["reason"])
        for e in sink.named("notify_queued")
        if e.fields.get("channel") == "sms" and e.fields.get("nseq") == nseq
    ]


@pytest.mark.parametrize("with_calendar", [True, False])
async def test_bulk_waits_for_ip_as_the_calendar_says_then_goes_by_sms(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink, with_calendar: bool
) -> None:
    net = network(SmscConfig(time_scale=0.001), 5)
    async with sms_world(tmp_path, store, clock, sink, sms_config(ttl=86400.0), net, CHANNELS) as (
        _broker,
        alice,
        bob,
    ):
        await guard(alice.subscribe("news.*"))
        if with_calendar:
            ok = await guard(alice.send_calendar([CalendarRule(channel="ip", p=0.5)]))
            assert ok.rules == 1
            stored = SqlCalendars(store.engine).get(ALICE)
            assert stored is not None and stored.calendar().probability("ip", clock()) == 0.5
        deaf = Deaf(alice)
        deaf.on = True
        await guard(bob.publish("news.daily", {}, b"digest"))
        await guard(sink.wait_for("media_disconnected", ALICE))
        if not with_calendar:
            sent = await guard(sink.wait_for("sms_sent", ALICE))
            assert sent.fields["nseq"] == 1
            return
        await guard(until(sink, lambda: bool(_sms_queued(sink, 1))))
        (reason,) = _sms_queued(sink, 1)
        assert reason.startswith(f"held until {clock() + 1800:.0f}")  # first_seen + 0.5 h
        assert sink.named("sms_sent") == []
        # Still held a minute before its time; asked again (a new publish) at its time,
        # it goes by SMS (the new one, just published, is held in its turn).
        clock.advance(1740)
        await guard(bob.publish("news.daily", {}, b"digest 2"))
        assert sink.named("sms_sent") == []
        clock.advance(61)
        await guard(bob.publish("news.daily", {}, b"digest 3"))
        sent = await guard(sink.wait_for("sms_sent", ALICE))
        assert sent.fields["nseq"] == 1
        assert [e.fields["nseq"] for e in sink.named("sms_sent")] == [1]
        await guard(alice.wait_event("sms_received", nseq=1))
        # IP returns: the held ones leave over IP; each reaches the application once.
        deaf.on = False
        await ip_back(alice)
        await guard(alice.wait_until(lambda: len(alice.delivered_since(0)) == 3))
        assert sorted(int(r["nseq"]) for r in alice.delivered_since(0)) == [1, 2, 3]


async def test_a_bad_calendar_is_refused_and_changes_nothing(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    import cbor2

    from mdeci.errors import FrameError
    from mdeci.frames import decode

    with pytest.raises(FrameError):
        decode(cbor2.dumps({"op": "calendar", "req": 1, "rules": [{"channel": "ip", "p": 2}]}))
    with pytest.raises(FrameError):
        CalendarRule(channel="ip", p=0.5, start_hour=20, end_hour=8)
    assert SqlCalendars(store.engine).get(ALICE) is None
