"""The documented deployment behind a real Kamailio, over UDP, TCP and TLS.

Kamailio (Debian ``kamailio``, started and stopped here) runs the stock
``configs/kamailio.cfg`` as registrar and record-routing proxy of ``localhost`` (``-A
WITH_TLS`` and the tls.cfg of docs/operations.md §9 for TLS). The broker registers there
as ``sip:broker@localhost`` (``registrar.embedded = false``) over the transport; two
``mdeci agent`` processes (``[sip] transports = ["<transport>"]``) use Kamailio as
registrar and outbound proxy and INVITE ``sip:broker@localhost`` through it, so the
broker sees a Request-URI rewritten to its contact and a digest whose ``uri`` is its AOR
(docs/sip.md). alice subscribes with a filter; bob publishes at 50/s while alice moves 20
times with ``mdeci move`` (re-REGISTER + re-INVITE via the route set): 0 lost, 0
duplicated, order kept. Kamailio's location table ends with one contact per agent (also
read with ``python -m sip bindings``); the broker's BYE (a kick) and the agents' BYEs on
shutdown go through Kamailio; a pjsua2 device calls through Kamailio over the same
transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mdeci.broker.app import run_broker
from mdeci.config import (
    AuthConfig,
    BrokerConfig,
    HostPort,
    RegistrarConfig,
    SipConfig,
    UserConfig,
)
from mdeci.store.repo import BrokerStore
from sip.aio.ua import UserAgent
from sip.tools.bindings import fetch
from sip.uri import NameAddr
from tests.broker.conftest import WaitingSink

# The store fixtures of the broker and store tests (a migrated SQLite file per test).
from tests.broker.conftest import store as store
from tests.e2e.harness_a import GUARD, check_exactly
from tests.e2e.harness_b import (
    AgentProcess,
    ApiPublisher,
    BrokerProcess,
    TailCollector,
    at_least,
    eventually,
)
from tests.e2e.test_handover import RUDP
from tests.peers import missing
from tests.sip.certs import Certs, make_certs
from tests.sip.interop.kamailio import Kamailio
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

MOVES = 20
PJSUA_PEER = Path(__file__).resolve().parents[1] / "sip" / "interop" / "pjsua_peer.py"
RATE = 50.0
DOMAIN = "localhost"


async def location(kamailio: Kamailio, user: str) -> list[str]:
    """The contacts Kamailio holds for ``user`` (what ``python -m sip bindings`` asks)."""
    return await asyncio.wait_for(fetch(kamailio.addr, f"sip:{user}@{DOMAIN}"), GUARD)


def bindings_cli(kamailio: Kamailio, user: str) -> str:
    """``python -m sip bindings`` as docs/operations.md §9 runs it: its one line."""
    out = subprocess.run(
        [sys.executable, "-m", "sip", "bindings", "--registrar",
         f"127.0.0.1:{kamailio.port}", "--aor", f"sip:{user}@{DOMAIN}"],
        capture_output=True, text=True, timeout=GUARD, check=True,
    )  # fmt: skip
    return out.stdout.strip()


async def pjsua_device_through(
    kamailio: Kamailio, sink: WaitingSink, transport: str = "udp", certs: Certs | None = None
) -> None:
    """A PJSIP (pjsua2) device of carol: REGISTER at Kamailio, INVITE
    sip:broker@localhost with Kamailio as outbound proxy (digest answered by PJSIP for
    the retargeted INVITE), a move with re-REGISTER and re-INVITE, BYE; all over
    ``transport`` (TLS: at Kamailio's TLS port, its certificate verified with ``certs``)."""
    try:
        import pjsua2  # noqa: F401
    except ImportError:
        missing("pjsua2 (PJSIP Python binding)", "pip install pjsua2-python")
    addr = kamailio.tls_addr if transport == "tls" else kamailio.addr
    assert addr is not None
    proxy = f"{addr[0]}:{addr[1]}"
    tls = [] if certs is None else [str(certs.ca), str(certs.cert), str(certs.key)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(PJSUA_PEER), proxy, proxy, "carol", "carol-secret", DOMAIN,
        "127.0.0.8", proxy, transport, *tls, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()  # ours, by PID
            await proc.wait()
    events = [json.loads(x) for x in out.decode().splitlines() if x.startswith("{")]
    steps = {e["event"]: e for e in events}
    assert proc.returncode == 0, out.decode() + err.decode()
    for step in ("registered", "confirmed", "reregistered", "reinvited", "hungup"):
        assert steps[step]["ok"], (step, events)
    carol = f"sip:carol@{DOMAIN}"
    await asyncio.wait_for(sink.wait_for("session_started", carol), GUARD)
    reinvited = await asyncio.wait_for(sink.wait_for("session_reinvited", carol), GUARD)
    assert str(reinvited.fields["addr"]).startswith("127.0.0.8:")
    await asyncio.wait_for(sink.wait_for("session_ended", carol), GUARD)


KAM_HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


@pytest.mark.parametrize("transport", ["udp", "tcp", "tls"])
async def test_agents_behind_kamailio(tmp_path: Path, store: BrokerStore, transport: str) -> None:
    """The deployment with SIP over ``transport`` on every hop: the broker registers at
    Kamailio over it; two ``mdeci agent`` processes with ``[sip] transports =
    ["<transport>"]`` register at Kamailio, INVITE ``sip:broker@localhost`` through it
    (record-routed); alice moves 20 times with ``mdeci move`` (re-REGISTER + re-INVITE via
    the route set, her old contact unbound) while bob publishes at 50/s: 0 lost, 0
    duplicated, order kept. The broker's own BYE (a kick of bob) and the agents' BYEs on
    their clean stop travel through Kamailio; Kamailio ends with one contact per agent
    (``python -m sip bindings`` prints it); a pjsua2 device does the same call over
    ``transport``. Every SIP message the broker and the agents receive comes over
    ``transport`` (their per-transport counters)."""
    certs = make_certs(tmp_path / "certs", ("127.0.0.1", *KAM_HOSTS, "127.0.0.100", "127.0.0.8"))
    kamailio = Kamailio(tmp_path, tls=certs if transport == "tls" else None)
    sink = WaitingSink()
    broker = None
    agents: list[AgentProcess] = []
    tail: TailCollector | None = None
    publisher: ApiPublisher | None = None
    try:
        await kamailio.ready()
        proxy = kamailio.tls_addr if transport == "tls" else kamailio.addr
        assert proxy is not None
        config = BrokerConfig(
            domain=DOMAIN,
            data_dir=tmp_path / "broker",
            sip=SipConfig(
                host="127.0.0.1", port=0, t1=0.02, t2=0.16, t4=0.2,
                transports=("udp", "tcp", "tls"), tls_port=0, tls_cert=certs.cert,
                tls_key=certs.key, tls_ca=certs.ca,
            ),
            rudp=RUDP,
            registrar=RegistrarConfig(
                embedded=False, address=HostPort(*proxy), transport=transport
            ),
            auth=AuthConfig(
                users=tuple(
                    UserConfig(user=u, password=f"{u}-secret")
                    for u in ("alice", "bob", "carol", "broker")
                )
            ),
        )  # fmt: skip
        broker = await run_broker(
            config, sip_listen=("127.0.0.1", 0), media_listen=("127.0.0.1", 0), store=store,
            log=sink,
        )  # fmt: skip
        (broker_contact,) = await location(kamailio, "broker")
        assert broker_contact == str(
            NameAddr.parse(broker.endpoint.ua.contact_header(transport)).uri
        )

        # The agents' [sip]: the transport, and for TLS the CA that verifies Kamailio and
        # a certificate of their own (Kamailio opens a TLS connection to their sips:
        # Contact for the broker's requests, RFC 3261 §26.2).
        sip = f'transports = ["{transport}"]\n'
        if transport == "tls":
            sip += f'tls_ca = "{certs.ca}"\ntls_cert = "{certs.cert}"\ntls_key = "{certs.key}"\n'
        via_kamailio = BrokerProcess(tmp_path / "kamailio-address")  # never started
        alice = AgentProcess(
            tmp_path / "alice", "alice", KAM_HOSTS[0], via_kamailio, address=proxy, sip=sip
        )
        bob = AgentProcess(
            tmp_path / "bob", "bob", "127.0.0.100", via_kamailio, address=proxy, sip=sip
        )
        for agent in (alice, bob):
            agents.append(await agent.start())
        for agent in agents:
            await agent.wait_connected()
            assert (await agent.status())["sip_transport"] == transport
        await sink.wait_for("session_started", f"sip:alice@{DOMAIN}")
        # Record-routed: the broker's dialog with alice has Kamailio in its route set,
        # over the transport.
        (dialog,) = [
            d for d in broker.endpoint.ua.dialogs.values() if d.remote_uri.startswith("sip:alice")
        ]
        assert dialog.route_set and f":{proxy[1]}" in dialog.route_set[0]
        assert UserAgent.dialog_transport(dialog) == transport

        tail = TailCollector(alice.socket).start()
        await alice.subscribe("kam.tick", "exists(i)", ttl=600)
        for _ in range(3):  # filtered out: never reaches alice
            await bob.publish("kam.tick", "noise", noise=1)
        publisher = ApiPublisher(bob, "kam.tick", RATE).start()
        await tail.wait_for(at_least(1))
        for k in range(1, MOVES + 1):
            mark = len(tail.records)
            host = KAM_HOSTS[k % len(KAM_HOSTS)]
            await alice.move(host)
            session = broker.endpoint.session_of(f"sip:alice@{DOMAIN}")
            assert session is not None and session[1][0] == host
            # Two notifications at the new address before the next move.
            await tail.wait_for(at_least(mark + 2))
        sent = await publisher.stop()
        publisher_elapsed = publisher.elapsed
        slow = sorted(publisher.latencies)[-3:]
        publisher = None
        await tail.wait_for(at_least(sent))
        check_exactly(tail.records, [f"t{i}" for i in range(sent)])

        # One contact per agent: alice's old ones are unbound after each re-INVITE (in
        # the background, so the last one may still be on its way).
        contact = (await alice.status())["sip_contact"]

        async def one_contact() -> bool:
            return await location(kamailio, "alice") == [contact]

        await eventually(one_contact)
        bob_contact = (await bob.status())["sip_contact"]
        assert await location(kamailio, "bob") == [bob_contact]
        assert bindings_cli(kamailio, "bob") == f"sip:bob@{DOMAIN} 1 {bob_contact}"

        # The broker's own in-dialog request through Kamailio: kicking bob sends him a
        # BYE along the route set, to his Contact, over the transport.
        before = (await bob.status())["sip_received"][transport]
        assert broker.endpoint.kick(f"sip:bob@{DOMAIN}")

        async def bye_seen() -> bool:
            return any(
                r["event"] == "session_ended" and r.get("reason") == "bye from broker"
                for r in bob.churn()
            )

        await eventually(bye_seen)
        assert (await bob.status())["sip_received"][transport] > before
        await bob.wait_connected()  # back through Kamailio
        for agent in agents:
            received = (await agent.status())["sip_received"]
            assert set(received) == {transport}, received
        print(
            f"\nkamailio/{transport}: {MOVES} moves of alice (a process) while bob (a "
            f"process) published {sent} ({sent / publisher_elapsed:.0f}/s): 0 lost, "
            "0 duplicated, order kept; one contact each; slowest pub calls "
            f"{', '.join(f'{x * 1000:.0f}' for x in slow)} ms"
        )
        # The agents' clean stop: BYE (and unREGISTER) through Kamailio.
        for agent in agents:
            assert await agent.stop() == 0, agent.stderr.decode()
        await sink.wait_for("session_ended", f"sip:alice@{DOMAIN}")
        assert await location(kamailio, "alice") == []
        await pjsua_device_through(kamailio, sink, transport, certs if transport == "tls" else None)
        assert set(broker.endpoint.ua.stats.received) == {transport}, (
            broker.endpoint.ua.stats.received
        )
    finally:
        if publisher is not None:
            with contextlib.suppress(Exception):
                await publisher.stop()
        if tail is not None:
            await tail.close()
        for agent in agents:
            await agent.stop()
        if broker is not None:
            await broker.close()
        kamailio.stop()
