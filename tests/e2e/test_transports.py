"""The data channel's negotiation end to end (docs/sip.md), with real processes on
loopback: agents on ``[media] transport = "auto"`` offer QUIC and RUDP and get the one
the broker's ``[media] transports`` takes, then deliver over it (nothing lost, nothing
duplicated, order kept); an agent offering only a transport the broker does not take is
answered 488 and stays DISCONNECTED, saying why. In-process: a QUIC connection that
ends is followed by a new one, nothing lost or repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from mdeci.agent.api import ApiClient
from mdeci.agent.daemon import run_agent
from mdeci.broker.links import QuicDataPeerLink
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
    broker_toml,
    check_exactly,
    is_connected,
    run_cli,
    start_agent,
    start_broker,
    stop,
    wait_status,
)
from tests.e2e.test_handover import Arrivals, Publisher, agent_config, start_publishing
from tests.e2e.test_handover import _broker as handover_broker
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

EVENTS = 100


@pytest.mark.parametrize("accept", ["rudp", "quic"])
async def test_auto_takes_the_transport_the_broker_accepts(
    tmp_path: Path, sip_stack: str, accept: str
) -> None:
    children: list[Child] = []
    tail: Tail | None = None
    try:
        broker, sip = await start_broker(
            tmp_path, broker_toml(tmp_path / "broker", transports=(accept,))
        )
        children.append(broker)
        socks = []
        for name, host in (("alice", "127.0.0.2"), ("bob", "127.0.0.4")):
            config = agent_toml(tmp_path / name, name, host, sip, stack=sip_stack, transport="auto")
            child, sock = await start_agent(tmp_path, name, config)
            children.append(child)
            socks.append(sock)
        a_sock, b_sock = socks
        for sock in socks:
            status = await wait_status(sock, is_connected)
            assert status["media_transport"] == accept
        out = await run_cli("sub", "news", "--ttl", "600", "--socket", str(a_sock))
        assert out.startswith("subscribed "), out
        tail = await Tail(a_sock).start()
        async with ApiClient(b_sock) as client:
            for i in range(EVENTS):
                answer = await client.call({"op": "pub", "subject": "news", "text": f"n{i}"})
                assert answer["state"] == "published", answer
        records = await asyncio.wait_for(tail.wait_count(EVENTS), GUARD)
        check_exactly(records, [f"n{i}" for i in range(EVENTS)])
        assert [r["nseq"] for r in records] == list(range(1, EVENTS + 1))
    finally:
        if tail is not None:
            await tail.close()
        for child in reversed(children):
            code = await stop(child)
            assert code == 0, f"{child.name} exited {code}: {child.stderr()}"


@pytest.mark.parametrize(("accept", "offer"), [("quic", "rudp"), ("rudp", "quic")])
async def test_an_offer_of_none_of_the_accepted_transports_gets_488(
    tmp_path: Path, sip_stack: str, accept: str, offer: str
) -> None:
    children: list[Child] = []
    try:
        broker, sip = await start_broker(
            tmp_path, broker_toml(tmp_path / "broker", transports=(accept,))
        )
        children.append(broker)
        config = agent_toml(
            tmp_path / "alice", "alice", "127.0.0.2", sip, stack=sip_stack, transport=offer
        )
        child, sock = await start_agent(tmp_path, "alice", config)
        children.append(child)
        status = await wait_status(sock, lambda s: s["alerts"].get("key", 0) >= 1)
        assert status["status"] == "DISCONNECTED" and status["media_transport"] is None
        assert "refused our session offer" in str(status["last_error"])
    finally:
        for child in reversed(children):
            code = await stop(child)
            assert code == 0, f"{child.name} exited {code}: {child.stderr()}"


async def test_a_quic_connection_that_ends_is_followed_by_a_new_one_losing_nothing(
    tmp_path: Path, store: BrokerStore
) -> None:
    """The broker drops alice's QUIC connection while bob publishes: the broker marks her
    DISCONNECTED, her agent re-INVITEs with new keys and opens a new connection, and her
    application gets every notification once, in order (in-process, ``mdeci`` stack)."""
    sink = WaitingSink()
    broker = await handover_broker(tmp_path, store, sink, transports=("quic",))
    port = broker.sip_addr[1]
    agents = [
        await run_agent(
            agent_config(tmp_path / name, name, host, port, transport="quic"),
            address_source=lo_only,
        )
        for name, host in (("alice", "127.0.0.2"), ("bob", "127.0.0.4"))
    ]
    a, b = agents
    arrivals = Arrivals(a.agent)
    publisher: Publisher | None = None
    try:
        publisher = await start_publishing(a, b, arrivals, ttl=600)
        assert a.status().media_transport == "quic"
        quic = a.agent.quic_media
        assert quic is not None
        first = quic.peer
        link = broker.service._users["sip:alice@localhost"]
        assert isinstance(link.peer, QuicDataPeerLink) and link.peer.peer is not None
        link.peer.peer.close("dropped by the test")
        event = await asyncio.wait_for(
            sink.wait_for("media_disconnected", "sip:alice@localhost"), GUARD
        )
        assert "quic" in str(dict(event.fields).get("reason"))
        await asyncio.wait_for(
            a.agent.wait_until(lambda: a.agent.event_counts["media_connected"] >= 2), GUARD
        )
        assert quic.peer is not None and quic.peer is not first
        mark = len(arrivals.received)
        await asyncio.wait_for(arrivals.at_least(mark + 20), GUARD)  # flowing again
        sent = await publisher.stop()
        publisher = None
        await asyncio.wait_for(arrivals.at_least(sent), GUARD)
        records = [r for _, r in arrivals.received]
        check_exactly(records, [f"t{i}" for i in range(sent)])
        assert [r["nseq"] for r in records] == list(range(1, sent + 1))
    finally:
        arrivals.close()
        if publisher is not None:
            with contextlib.suppress(Exception):
                await publisher.stop()
        for agent in agents:
            await agent.close()
        await broker.close()
