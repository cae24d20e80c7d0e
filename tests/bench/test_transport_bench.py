"""Benchmark: the broker's delivery to one agent over RUDP and over QUIC, through the
impairment proxy, without loss and at 1 % and 5 % loss both ways; ``test_report`` prints
QUIC's broker CPU per notification and goodput against RUDP's (the reference) per loss.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_transport_bench.py``
(``MDECI_TRANSPORT_BENCH_EVENTS`` overrides the 2,000 notifications).

Set-up: a broker (``[media] transports`` one of them) in this process, alice's agent
(``[media] transport`` the same) a ``python -m mdeci agent`` child with an application
reading ``tail``; the broker's data channel socket sits behind ``python -m rudp.impair``
(a separate process, seed 1, 5 ms one-way delay, the stated loss both ways; its SDP
answer names the proxy), so every datagram of the data channel crosses the impaired
link. SIP is direct. Alice subscribes, then the broker's core takes the publishes in
batches of 100 (as a busy publisher's arrive) and alice's application receives every
notification. Measured from the first publish to the last arrival: wall time, goodput
(payload bytes per second), and per notification the CPU of the broker (this process:
its loop and database thread), of the agent's process and of the proxy's. Asserted:
nothing lost, nothing duplicated, order kept, every datagram through the proxy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from pathlib import Path

import pytest

from mdeci.agent.api import ApiClient
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
from tests.broker.conftest import WaitingSink

# The store fixtures of the broker and store tests (a migrated SQLite file per test).
from tests.broker.conftest import store as store
from tests.e2e.harness_a import (
    Tail,
    agent_toml,
    check_exactly,
    is_connected,
    start_agent,
    stop,
    wait_status,
)
from tests.e2e.test_handover import RUDP
from tests.rudp.test_bench import Proxy
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

EVENTS = int(os.environ.get("MDECI_TRANSPORT_BENCH_EVENTS", "2000"))
PAYLOAD = 1000  # bytes per notification
BATCH = 100  # publishes per core call
TIMEOUT = 300
# The agent's [rudp]: the broker's RUDP settings (test_handover's RUDP).
AGENT_RUDP = "rto_initial = 0.2\nrto_min = 0.05\nrto_max = 1.0\nmax_retries = 4\nack_delay = 0.002"
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


# (transport, loss) -> (broker CPU seconds per notification, goodput in bytes/s)
RESULTS: dict[tuple[str, float], tuple[float, float]] = {}


@pytest.mark.bench
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("loss", [0.0, 0.01, 0.05], ids=["loss0", "loss1", "loss5"])
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
    sip = broker.sip_addr
    config = agent_toml(
        tmp_path / "alice", "alice", "127.0.0.2", sip, rudp=AGENT_RUDP, transport=transport
    )
    a, a_sock = await start_agent(tmp_path, "alice", config)
    tail: Tail | None = None
    try:
        status = await wait_status(a_sock, is_connected)
        assert status["media_transport"] == transport
        async with ApiClient(a_sock) as client:
            await client.call({"op": "sub", "subject": "bench.tick", "ttl": 600})
        tail = await Tail(a_sock).start()
        # Each payload is its own name, padded to PAYLOAD bytes (the records' "text").
        texts = [f"b{i}".ljust(PAYLOAD, ".") for i in range(EVENTS)]
        pubs = [
            encode(Pub(req=i + 1, msg_id=f"b{i}", subject="bench.tick", payload=text.encode()))
            for i, text in enumerate(texts)
        ]
        proxy_cpu0, agent_cpu0 = proxy.cpu(), process_cpu(a.pid)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for start in range(0, EVENTS, BATCH):
            batch = [(FEED, data) for data in pubs[start : start + BATCH]]
            await broker.service.worker.run(broker.broker.handle_frames, batch)
        records = await asyncio.wait_for(tail.wait_count(EVENTS), TIMEOUT - 60)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        proxy_cpu = proxy.cpu() - proxy_cpu0
        agent_cpu = process_cpu(a.pid) - agent_cpu0
        check_exactly(records, texts)
        # Through the proxy: the broker's peer is the proxy's upstream socket, not alice's.
        peer_addr = broker.service._users["sip:alice@localhost"].peer.addr
        assert peer_addr is not None and peer_addr[0] == BROKER_MEDIA_HOST, peer_addr
        RESULTS[(transport, loss)] = (cpu / EVENTS, EVENTS * PAYLOAD / wall)
        print(
            f"\ntransport bench, {transport}, loss {loss:.0%} both ways (proxy, 5 ms one-way): "
            f"{EVENTS} x {PAYLOAD} B in {wall:.2f} s: goodput "
            f"{EVENTS * PAYLOAD / wall / 1e6:.2f} MB/s ({EVENTS / wall:.0f} notifications/s); "
            f"CPU per notification: broker {cpu / EVENTS * 1e6:.0f} us, agent "
            f"{agent_cpu / EVENTS * 1e6:.0f} us, proxy {proxy_cpu / EVENTS * 1e6:.0f} us; "
            f"0 lost, 0 duplicated, order kept"
        )
    finally:
        if tail is not None:
            await tail.close()
        await stop(a)
        await broker.close()
        proxy.stop()


@pytest.mark.bench
def test_report() -> None:
    """QUIC against RUDP (the reference), measured in this run: broker CPU per
    notification and goodput, per loss rate (goal: CPU at most 2x RUDP's)."""
    print("\n\n| loss | broker CPU per notification, QUIC / RUDP | goodput, QUIC / RUDP |")
    print("|---|---|---|")
    for loss in (0.0, 0.01, 0.05):
        quic, rudp = RESULTS.get(("quic", loss)), RESULTS.get(("rudp", loss))
        if quic is None or rudp is None:
            continue
        print(f"| {loss:.0%} | {quic[0] / rudp[0]:.2f}x | {quic[1] / rudp[1]:.2f}x |")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
