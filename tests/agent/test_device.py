"""The device side of channel selection in the agent core, on a fake clock: the network
kind it reports at each session and move, the ``[calendar]`` it sends, and its own
publishes held on a costly network until Wi-Fi (or their deadline)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mdeci.agent.core import AgentCore
from mdeci.agent.events import Invite, MoveSip, Reinvite
from mdeci.channels import default_classes
from mdeci.config import AgentConfig
from mdeci.config.agent import (
    AgentCalendarConfig,
    CalendarRuleConfig,
    NetworkConfig,
    NetworkKindConfig,
)
from mdeci.frames import Calendar, CalendarOk, Device, List, Pub, PubOk, Subs, encode
from tests.agent.test_core import MEDIA, SIP, Counter, Rig, config

WIFI_HOST = "127.0.0.3"
NETWORK = NetworkConfig(
    kinds=(
        NetworkKindConfig(kind="wifi", price_per_mb=0.0, latency_ms=20, prefixes=("127.0.0.3/32",)),
        NetworkKindConfig(
            kind="cellular", price_per_mb=5.0, energy_mw=1500, latency_ms=250,
            prefixes=("127.0.0.0/8",),
        ),
    ),
    battery=0.8,
)  # fmt: skip
CALENDAR = AgentCalendarConfig(rules=(CalendarRuleConfig(channel="wifi", p=0.9),))
BULK_DMAX = default_classes()["bulk"].max_delay


def device_rig(tmp_path: Path, calendar: AgentCalendarConfig = CALENDAR) -> Rig:
    rig = Rig(tmp_path)
    cfg: AgentConfig = dataclasses.replace(config(tmp_path), network=NETWORK, calendar=calendar)
    rig.core = AgentCore(
        cfg,
        rig.files,
        rig.events.append,
        random_bytes=Counter(),
        jitter=lambda: 0.5,
        sip_addr=SIP,
        media_addr=MEDIA,
    )
    return rig


def connect(rig: Rig) -> None:
    """Connect, and answer the calendar the agent sends."""
    rig.connect()
    for frame in rig.frames(rig.commands()):
        if isinstance(frame, Calendar):
            rig.core.frame_received(rig.now, encode(CalendarOk(req=frame.req, rules=1)))
    rig.commands()


def move_to_wifi(rig: Rig) -> list[object]:
    core = rig.core
    core.address_changed(rig.now, WIFI_HOST)
    rig.commands()
    core.media_bound(rig.now, (WIFI_HOST, 4000))
    reinvite = rig.sip(rig.ok(MoveSip(WIFI_HOST), local_addr=(WIFI_HOST, 5070)))
    assert isinstance(reinvite, Reinvite)
    return list(rig.frames(rig.ok(reinvite, rig.answer(reinvite.offer, new_keys=False))))


def test_reports_network_and_calendar_at_session_start(tmp_path: Path) -> None:
    rig = device_rig(tmp_path)
    rig.core.start(rig.now)
    register = rig.sip(rig.commands())
    invite = rig.sip(rig.ok(register))
    assert isinstance(invite, Invite)
    probe = rig.frames(rig.ok(invite, rig.answer(invite.offer)))[-1]
    assert isinstance(probe, List)
    rig.core.frame_received(rig.now, encode(Subs(req=probe.req)))
    sent = rig.frames(rig.commands())
    (device,) = [f for f in sent if isinstance(f, Device)]
    assert device.network == "cellular" and device.battery == 0.8
    assert {b.network: b.latency_ms for b in device.best} == {"wifi": 20.0, "cellular": 250.0}
    (calendar,) = [f for f in sent if isinstance(f, Calendar)]
    assert [(r.channel, r.p, r.weekdays) for r in calendar.rules] == [("wifi", 0.9, 0x7F)]
    assert sent.index(device) < sent.index(calendar)
    rig.core.frame_received(rig.now, encode(CalendarOk(req=calendar.req, rules=1)))
    # A move tells the new network, without the calendar again.
    after = move_to_wifi(rig)
    assert [f.network for f in after if isinstance(f, Device)] == ["wifi"]
    assert not [f for f in after if isinstance(f, Calendar)]


def test_bulk_publish_waits_on_cellular_and_goes_on_wifi_urgent_goes_at_once(
    tmp_path: Path,
) -> None:
    rig = device_rig(tmp_path)
    connect(rig)
    core = rig.core
    _, req = core.publish(rig.now, "news.bulk", payload=b"x" * 300, qclass="bulk")
    core.sync_outbox(rig.now)
    assert req is None  # buffered: it waits
    assert [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)] == []
    decided = rig.churn_record("publish_decided")
    assert "network=cellular class=bulk decision=wait for=wifi" in decided["reason"]
    # The wait is P x Dmax from the publish, at most.
    timer = core.get_timer()
    assert timer is not None and timer <= rig.now + 0.9 * BULK_DMAX + 1e-6

    msg_id, urgent_req = core.publish(rig.now, "alerts.fire", urgent=True)
    core.sync_outbox(rig.now)
    (urgent,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    assert urgent.msg_id == msg_id and urgent.urgent and urgent_req == urgent.req
    core.frame_received(rig.now, encode(PubOk(req=urgent.req, msg_id=msg_id, matched=0)))

    rig.now += 60.0  # a minute later the device reaches Wi-Fi
    after = move_to_wifi(rig)
    (bulk,) = [f for f in after if isinstance(f, Pub)]
    assert bulk.subject == "news.bulk" and bulk.qclass == "bulk"
    assert [f.network for f in after if isinstance(f, Device)] == ["wifi"]
    assert after.index(next(f for f in after if isinstance(f, Device))) < after.index(bulk)


def test_held_publish_goes_on_cellular_at_its_deadline(tmp_path: Path) -> None:
    rig = device_rig(tmp_path)
    connect(rig)
    core = rig.core
    core.publish(rig.now, "news.bulk", payload=b"y", qclass="bulk")
    core.sync_outbox(rig.now)
    rig.commands()
    until = core.get_timer()
    assert until == rig.now + 0.9 * BULK_DMAX
    rig.now = until - 0.001
    core.handle_timer(rig.now)
    assert [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)] == []
    rig.now = until
    core.handle_timer(rig.now)
    (bulk,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    assert bulk.subject == "news.bulk"


def test_without_calendar_or_network_kinds_nothing_waits(tmp_path: Path) -> None:
    rig = device_rig(tmp_path, calendar=AgentCalendarConfig())
    rig.connect()
    rig.commands()
    rig.core.publish(rig.now, "news.bulk", qclass="bulk")
    rig.core.sync_outbox(rig.now)
    assert [f.subject for f in rig.frames(rig.commands()) if isinstance(f, Pub)] == ["news.bulk"]

    plain = Rig(tmp_path / "plain")  # no [network]: no device frame, no decision
    plain.connect()
    assert not [f for f in plain.frames(plain.commands()) if isinstance(f, Device)]
    plain.core.publish(plain.now, "news.bulk", qclass="bulk")
    plain.core.sync_outbox(plain.now)
    assert [f.subject for f in plain.frames(plain.commands()) if isinstance(f, Pub)] == [
        "news.bulk"
    ]
    assert "publish_decided" not in plain.churn()


def test_the_interface_names_the_network_before_the_address(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    kinds = (
        NetworkKindConfig(kind="wifi", interfaces=("wlan0",)),
        NetworkKindConfig(kind="cellular", prefixes=("127.0.0.0/8",)),
    )
    cfg = dataclasses.replace(config(tmp_path), network=NetworkConfig(kinds=kinds))
    rig.core = AgentCore(
        cfg, rig.files, rig.events.append, random_bytes=Counter(), jitter=lambda: 0.5,
        sip_addr=SIP, media_addr=MEDIA,
    )  # fmt: skip
    rig.core.interface_of = lambda host: "wlan0" if host == MEDIA[0] else None
    rig.connect()
    (device,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Device)]
    assert device.network == "wifi"  # the address alone would say cellular


def test_interface_of_reads_the_kernels_addresses() -> None:
    from mdeci.agent.ipmonitor import interface_of

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.77") is None and interface_of("::1") is None
