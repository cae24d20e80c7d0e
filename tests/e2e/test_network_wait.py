"""The thesis' waiting example, live in network namespaces (docs/channels.md "Networks
as channels").

The device namespace has two veths, ``wifi`` and ``cell``; the agent (``mdeci agent`` in
the namespace, netlink mode) maps them to the network kinds ``wifi`` (free) and
``cellular`` (costly) by interface. Its calendar, sent with ``mdeci calendar --expect``,
says Wi-Fi comes in ``WIFI_IN`` seconds (and nothing before: P is 0 when the
notifications are published, 1 within the bulk class's hour). The
default route goes through ``cell``: bulk notifications published for the device are
held by the broker, an urgent one arrives at once: on an IP-only broker (no SMS
configured), and on a broker with SMS and the device's MSISDN (SMS is a channel there, and
the decision is the same: the device is reachable over IP).
When the default route moves to ``wifi`` the agent re-INVITEs from there, tells the
broker its new network, and the bulk ones arrive. Nothing is lost or duplicated, and
the broker's churn log has a ``channel_decided`` line for each decision. The device's
own bulk publish waits for Wi-Fi the same way (``held``), its urgent one goes at once.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from mdeci.agent.api import ApiClient
from mdeci.agent.daemon import RunningAgent, run_agent
from mdeci.broker.app import RunningBroker, run_broker
from mdeci.config import (
    AuthConfig,
    BrokerConfig,
    BrokerMediaConfig,
    BrokerSmsConfig,
    SipConfig,
    UserConfig,
)
from mdeci.sms.gateway import SimulatedNetwork
from mdeci.store.repo import BrokerStore
from tests.agent.farend import lo_only
from tests.broker.conftest import WaitingSink

# The store fixtures of the broker and store tests (a migrated SQLite file per test).
from tests.broker.conftest import store as store
from tests.e2e.harness_a import (
    GUARD,
    Child,
    Tail,
    agent_toml,
    check_exactly,
    is_connected,
    run_cli,
    run_ip,
    start_agent,
    wait_status,
)
from tests.e2e.harness_b import RUDP
from tests.e2e.test_handover import _broker, add_veth, agent_config, close_netns_run
from tests.peers import require_netns
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

ALICE = "sip:alice@localhost"
NETWORK = """
[network]
battery = 0.9
[[network.kinds]]
kind = "wifi"
price_per_mb = 0.0
interfaces = ["wifi"]
[[network.kinds]]
kind = "cellular"
price_per_mb = 0.0048828125
energy_mw = 1500.0
latency_ms = 250.0
interfaces = ["cell"]
"""
BULK = 3
WIFI_IN = 20  # seconds: the calendar's Wi-Fi, well within the bulk class's hour
BROKER_NO, ALICE_NO = "+15550000001", "+15550000002"


async def _sms_broker(tmp: Path, store: BrokerStore, sink: WaitingSink, host: str) -> RunningBroker:
    """As ``_broker``, with SMS on a simulated network and alice's MSISDN."""
    config = BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host=host, port=0, t1=0.02, t2=0.16, t4=0.2),
        media=BrokerMediaConfig(host=host),
        rudp=RUDP,
        auth=AuthConfig(
            users=(
                UserConfig(user="alice", password="alice-secret", msisdn=ALICE_NO),
                UserConfig(user="bob", password="bob-secret"),
            )
        ),
        sms=BrokerSmsConfig(enabled=True, number=BROKER_NO),
    )
    gateway = SimulatedNetwork().gateway(BROKER_NO)
    return await run_broker(
        config, sip_listen=(host, 0), media_listen=(host, 0), store=store, log=sink,
        sms_gateway=gateway,
    )  # fmt: skip


@pytest.mark.parametrize("sms", [False, True], ids=["ip-only", "with-sms"])
async def test_bulk_waits_for_the_wifi_route_urgent_goes_at_once(
    tmp_path: Path, store: BrokerStore, sms: bool
) -> None:
    require_netns()
    tag = os.getpid() % 10000
    n = 20 + os.getpid() % 200
    ns, wifi_h, cell_h = f"mdeci-e2eq-{tag}", f"mqw{tag}", f"mqc{tag}"
    wifi_ip, cell_ip, broker_ip = f"10.81.{n}.2", f"10.82.{n}.2", f"10.83.{n}.1"
    a: Child | None = None
    b: RunningAgent | None = None
    broker: RunningBroker | None = None
    tail: Tail | None = None
    try:
        run_ip("netns", "add", ns)
        add_veth(ns, wifi_h, "wifi", f"10.81.{n}")
        add_veth(ns, cell_h, "cell", f"10.82.{n}")
        run_ip("addr", "add", f"{broker_ip}/32", "dev", cell_h)
        run_ip("-n", ns, "link", "set", "lo", "up")
        run_ip("-n", ns, "route", "add", "default", "via", f"10.82.{n}.1", "dev", "cell")

        sink = WaitingSink()
        if sms:
            broker = await _sms_broker(tmp_path, store, sink, broker_ip)
            assert broker.config.sms.enabled
        else:
            broker = await _broker(tmp_path, store, sink, host=broker_ip)
            assert not broker.config.sms.enabled  # an IP-only broker
        sip = broker.sip_addr
        toml = agent_toml(
            tmp_path / "alice",
            "alice",
            cell_ip,
            sip,
            ip_monitor='mode = "netlink"\npoll_interval = 30.0',
        )
        a, a_sock = await start_agent(
            tmp_path, "alice", toml + NETWORK, prefix=("ip", "netns", "exec", ns)
        )
        b = await run_agent(
            agent_config(tmp_path / "bob", "bob", broker_ip, sip[1], broker_ip),
            address_source=lo_only,
        )
        await wait_status(a_sock, is_connected)
        await asyncio.wait_for(b.wait_connected(), GUARD)
        # The device's calendar: Wi-Fi at the destination, reached in WIFI_IN seconds.
        kept = await run_cli(
            "calendar", "--expect", f"wifi:1:{WIFI_IN}s:1h", "--socket", str(a_sock)
        )
        assert kept.strip() == "calendar kept: 1 rules"
        async with ApiClient(a_sock) as client:
            await client.call({"op": "sub", "subject": "trip.#", "ttl": 600})
        tail = await Tail(a_sock).start()
        await asyncio.wait_for(b.agent.subscribe("home.#"), GUARD)
        uploads = b.agent.listen()
        async with ApiClient(a_sock) as client:
            # The device's own publishes: bulk waits for Wi-Fi, urgent goes now.
            photo = await client.call(
                {"op": "pub", "subject": "home.photo", "text": "photo", "qclass": "bulk"}
            )
            assert photo["state"] == "held"
            sos = await client.call(
                {"op": "pub", "subject": "home.sos", "text": "sos", "urgent": True}
            )
            assert sos["state"] == "published"
        got = await asyncio.wait_for(uploads.get(), GUARD)
        assert got["text"] == "sos" and uploads.empty()

        for i in range(BULK):
            await asyncio.wait_for(
                b.agent.publish("trip.digest", {"i": i}, f"bulk{i}".encode(), qclass="bulk"),
                GUARD,
            )
        await asyncio.wait_for(b.agent.publish("trip.alert", {}, b"urgent", urgent=True), GUARD)
        first = await asyncio.wait_for(tail.wait_count(1), GUARD)
        assert first[0]["text"] == "urgent" and first[0]["nseq"] == BULK + 1
        await asyncio.wait_for(sink.wait_for("channel_decided", ALICE, count=BULK + 1), GUARD)
        # The IP path's network decisions (with SMS, the SMS side logs its own too).
        held = [
            e
            for e in sink.named("channel_decided")
            if e.uri == ALICE and str(e.fields["reason"]).startswith("network=")
        ]
        reasons = {int(e.fields["nseq"]): str(e.fields["reason"]) for e in held}  # type: ignore[arg-type]
        for nseq in range(1, BULK + 1):
            assert reasons[nseq].startswith("network=cellular class=bulk decision=wait for=wifi")
            assert " p=1 " in reasons[nseq]  # the Wi-Fi to come, not any there now
        assert reasons[BULK + 1] == "network=cellular class=urgent decision=deliver"
        assert len(tail.records) == 1  # the bulk ones wait

        # The device reaches Wi-Fi: the default route moves, the agent follows it.
        run_ip("-n", ns, "route", "replace", "default", "via", f"10.81.{n}.1", "dev", "wifi")
        records = await asyncio.wait_for(tail.wait_count(BULK + 1), GUARD)
        check_exactly(records[1:], [f"bulk{i}" for i in range(BULK)])
        assert [r["nseq"] for r in records] == [BULK + 1, *range(1, BULK + 1)]
        status = await wait_status(a_sock, lambda s: s["sip_addr"].startswith(wifi_ip + ":"))
        assert status["status"] == "CONNECTED"
        got = await asyncio.wait_for(uploads.get(), GUARD)  # the held upload, on Wi-Fi
        assert got["text"] == "photo"
        status = await wait_status(a_sock, lambda s: s["buffered"] == 0)
        decided = (tmp_path / "alice" / "churn.log").read_text()
        assert '"event":"publish_decided"' in decided
        assert "network=cellular class=bulk decision=wait for=wifi" in decided
        released = [
            str(e.fields["reason"])
            for e in sink.named("channel_decided")
            if e.uri == ALICE and str(e.fields["reason"]).startswith("network=wifi")
        ]
        assert released == ["network=wifi class=bulk decision=deliver"] * BULK
        await asyncio.wait_for(sink.wait_for("notify_delivered", ALICE, count=BULK + 1), GUARD)
        assert uploads.empty()  # the upload once
        assert not [e for e in sink.named("sms_sent") if e.uri == ALICE]  # IP carried all
        print(
            f"\nnetwork wait: {BULK} bulk held on cellular, delivered after the route moved "
            f"to wifi; urgent at once; 0 lost, 0 dup; the device's bulk upload waited too"
        )
    finally:
        await close_netns_run(tail, None, a, b, broker, ns, (wifi_h, cell_h))
    # The acks reached the store once nothing was held below them.
    assert store.queues.depth(ALICE) == 0
