"""Benchmark: the broker's delivery to one agent over RUDP and over QUIC, through the
impairment proxy, without loss and at 5 % loss both ways.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_transport_bench.py``
(``MDECI_TRANSPORT_BENCH_EVENTS`` overrides the 2,000 notifications).

Set-up: a broker (``[media] transports`` one of them) and alice's agent (``[media]
transport`` the same) in this process; the broker's data channel socket sits behind
``python -m rudp.impair`` (a separate process, seed 1, 5 ms one-way delay, the stated loss
both ways; its SDP answer names the proxy), so every datagram of the data channel
crosses the impaired link. SIP is direct. Alice subscribes, then the broker's core takes
the publishes in batches of 100 (as a busy publisher's arrive) and alice's application
receives every notification. Measured from the first publish to the last arrival: wall
time, goodput (payload bytes per second), and this process's CPU (broker, its database
thread and the agent; the proxy's is its own) per notification. Asserted: nothing lost,
nothing duplicated, order kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from pathlib import Path

import pytest

from mdeci.agent.daemon import run_agent
from mdeci.broker.app import RunningBroker, run_broker
from mdeci.config import (
    AuthConfig,
    BrokerConfig,
    BrokerMediaConfig,
    QueueConfig,
    SipConfig,
    UserConfig,
)
from mdeci.frames import Pub, encode
from mdeci.store.repo import BrokerStore
from tests.agent.farend import lo_only
from tests.broker.conftest import WaitingSink

# The store fixtures of the broker and store tests (a migrated SQLite file per test).
from tests.broker.conftest import store as store
from tests.e2e.harness_a import check_exactly
from tests.e2e.test_handover import RUDP, Arrivals, agent_config
from tests.rudp.test_bench import Proxy
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

EVENTS = int(os.environ.get("MDECI_TRANSPORT_BENCH_EVENTS", "2000"))
PAYLOAD = 1000  # bytes per notification
BATCH = 100  # publishes per core call
TIMEOUT = 300
FEED = "sip:feed@localhost"
BROKER_MEDIA_HOST = "::1"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.bind((BROKER_MEDIA_HOST, 0))
        return int(sock.getsockname()[1])


async def _broker(
    tmp: Path, store: BrokerStore, sink: WaitingSink, transport: str, port: int
) -> RunningBroker:
    # The data channel's socket on ::1 and the agent on IPv4: the broker cannot reach the
    # agent's own address (an IPv6 socket bound to ::1 does not send to IPv4), so its
    # datagrams, as the agent's, cross the proxy (RUDP would otherwise find the direct
    # loopback path by path validation and leave the proxy).
    media = BrokerMediaConfig(host=BROKER_MEDIA_HOST, transports=(transport,))
    if transport == "quic":
        media = dataclasses.replace(media, quic_port=port)
    else:
        media = dataclasses.replace(media, port=port)
    config = BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host="127.0.0.1", port=0),
        media=media,
        rudp=RUDP,
        # Room for the whole run in alice's queue: the overflow policy is not measured.
        queue=QueueConfig(max_per_uri=2 * EVENTS),
        auth=AuthConfig(users=(UserConfig(user="alice", password="alice-secret"),)),
    )
    return await run_broker(config, sip_listen=("127.0.0.1", 0), store=store, log=sink)


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("loss", [0.0, 0.05], ids=["loss0", "loss5"])
@pytest.mark.parametrize("transport", ["rudp", "quic"])
async def test_delivery_over_each_transport_through_the_impairment_proxy(
    tmp_path: Path, store: BrokerStore, transport: str, loss: float
) -> None:
    port = _free_udp_port()
    proxy = Proxy((BROKER_MEDIA_HOST, port), loss, tcp=False)
    sink = WaitingSink()
    broker = await _broker(tmp_path, store, sink, transport, port)
    broker.service.advertise = proxy.addr  # the answer's c=: the proxy's host
    if transport == "quic":
        broker.service.quic_advertise = proxy.addr
    config = agent_config(tmp_path / "alice", "alice", "127.0.0.2", broker.sip_addr[1])
    config = dataclasses.replace(
        config, media=dataclasses.replace(config.media, transport=transport)
    )
    a = await run_agent(config, address_source=lo_only)
    arrivals = Arrivals(a.agent)
    try:
        await asyncio.wait_for(a.wait_connected(), 30)
        assert a.status().media_transport == transport
        await asyncio.wait_for(a.agent.subscribe("bench.tick", ttl=600), 30)
        # Each payload is its own name, padded to PAYLOAD bytes (the records' "text").
        texts = [f"b{i}".ljust(PAYLOAD, ".") for i in range(EVENTS)]
        pubs = [
            encode(Pub(req=i + 1, msg_id=f"b{i}", subject="bench.tick", payload=text.encode()))
            for i, text in enumerate(texts)
        ]
        proxy_cpu0 = proxy.cpu()
        cpu0, t0 = time.process_time(), time.perf_counter()
        for start in range(0, EVENTS, BATCH):
            batch = [(FEED, data) for data in pubs[start : start + BATCH]]
            await broker.service.worker.run(broker.broker.handle_frames, batch)
        await asyncio.wait_for(arrivals.at_least(EVENTS), TIMEOUT - 60)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        proxy_cpu = proxy.cpu() - proxy_cpu0
        records = [r for _, r in arrivals.received]
        check_exactly(records, texts)
        # Through the proxy: the broker's peer is the proxy's upstream socket, not alice's.
        peer_addr = broker.service._users["sip:alice@localhost"].peer.addr
        assert peer_addr is not None and peer_addr[0] == BROKER_MEDIA_HOST, peer_addr
        print(
            f"\ntransport bench, {transport}, loss {loss:.0%} both ways (proxy, 5 ms one-way): "
            f"{EVENTS} x {PAYLOAD} B in {wall:.2f} s: goodput "
            f"{EVENTS * PAYLOAD / wall / 1e6:.2f} MB/s ({EVENTS / wall:.0f} notifications/s); "
            f"CPU {cpu / EVENTS * 1e6:.0f} us per notification (broker + agent), "
            f"proxy {proxy_cpu / EVENTS * 1e6:.0f} us; 0 lost, 0 duplicated, order kept"
        )
    finally:
        arrivals.close()
        await a.close()
        await broker.close()
        proxy.stop()
