"""Handover: delivery follows a device that changes address.

- Loopback: while B publishes (``MDECI_HANDOVER_RATE`` per second, default 200), A moves 100
  times (127.0.0.2 -> .3 -> ... -> .11 -> .2 ...): nothing lost, nothing duplicated,
  order kept; the restore time (address change -> first notification received at the new
  address) is printed, p50 and p99 (docs/benchmarks.md, "Handover under loss").
- Network namespace: A runs as ``ip netns exec NS python -m mdeci agent`` behind a veth
  pair with ``ip_monitor.mode = "netlink"``; its interface address is changed under it
  (``ip addr del`` / ``ip addr add`` inside the namespace) and delivery resumes with
  nothing lost or duplicated. The broker listens on the veth peer in the root namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent import Agent
from mdeci.agent.api import ApiClient
from mdeci.agent.daemon import RunningAgent, run_agent
from mdeci.agent.ipmonitor import is_held, make_monitor, netlink_source
from mdeci.broker.app import RunningBroker, run_broker
from mdeci.config import (
    AgentConfig,
    AuthConfig,
    BrokerConfig,
    BrokerMediaConfig,
    HostPort,
    IpMonitorConfig,
    IpMonitorMode,
    SipConfig,
    UserConfig,
)
from mdeci.store.repo import BrokerStore
from rudp.config import RudpConfig
from tests.agent.farend import agent_config as farend_agent_config
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
    percentile,
    run_ip,
    start_agent,
    stop,
    wait_status,
)
from tests.peers import require_netns
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

MOVES = 100
# Publishes per second offered by B: 200/s, the rate handover is specified for. At most
# OUTSTANDING publishes wait for pub-ok, so on a slow machine the offered rate drops (the
# run prints what B got through) instead of a backlog growing without bound. A move keeps
# the RUDP association and the broker's stream position (BrokerService.connected):
# nothing is sent twice.
RATE = float(os.environ.get("MDECI_HANDOVER_RATE", "200"))
MAX_EVENTS = 20_000  # bounds the publisher whatever happens
OUTSTANDING = 16  # publishes of B in flight at once
# Retransmissions as in harness_a.FAST_RUDP: quick, but ~1.5 s before giving up, so a
# loaded shared machine stalling the event loop does not fail a healthy association.
RUDP = RudpConfig(rto_initial=0.2, rto_min=0.05, rto_max=1.0, max_retries=4, ack_delay=0.002)
A_HOSTS = tuple(f"127.0.0.{n}" for n in range(2, 12))


async def _broker(
    tmp: Path,
    store: BrokerStore,
    sink: WaitingSink,
    host: str = "127.0.0.1",
    transports: tuple[str, ...] = ("rudp",),
) -> RunningBroker:
    config = BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host=host, port=0, t1=0.02, t2=0.16, t4=0.2),
        media=BrokerMediaConfig(host=host, transports=transports),
        rudp=RUDP,
        auth=AuthConfig(
            users=tuple(UserConfig(user=u, password=f"{u}-secret") for u in ("alice", "bob"))
        ),
    )
    return await run_broker(
        config, sip_listen=(host, 0), media_listen=(host, 0), store=store, log=sink
    )


def agent_config(
    state: Path,
    user: str,
    host: str,
    port: int,
    broker_host: str = "127.0.0.1",
    stack: str = "mdeci",
    transport: str = "rudp",
) -> AgentConfig:
    config = farend_agent_config(state, user, host, port)
    where = HostPort(broker_host, port)
    return dataclasses.replace(
        config,
        sip=dataclasses.replace(config.sip, stack=stack),
        media=dataclasses.replace(config.media, transport=transport),
        rudp=RUDP,
        registrar=dataclasses.replace(config.registrar, address=where),
        broker=dataclasses.replace(config.broker, address=where),
    )


class Publisher:
    """B publishing ``t<i>`` at ``rate`` per second until stopped (or ``limit`` events).

    Each publish is its own task, so the offered rate does not depend on the round trip
    to ``pub-ok``. Order is still B's: a publish reaches the RUDP core before its task
    first suspends, and asyncio starts tasks in creation order.
    """

    def __init__(self, b: RunningAgent, subject: str, rate: float, limit: int = MAX_EVENTS) -> None:
        self.b = b
        self.limit = limit
        self.subject = subject
        self.interval = 1.0 / rate
        self.sent = 0
        self.elapsed = 0.0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pubs: list[asyncio.Task[None]] = []

    def start(self) -> Publisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def _one(self, i: int) -> None:
        result = await asyncio.wait_for(
            self.b.agent.publish(self.subject, {"i": i}, f"t{i}".encode()), GUARD
        )
        assert result.state in ("published", "sent", "buffered"), result

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not self._stop.is_set() and self.sent < self.limit:
            # Pacing (the offered load), not synchronisation.
            delay = start + self.sent * self.interval - loop.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                if self._stop.is_set():
                    break
            # At most OUTSTANDING publishes wait for pub-ok: when the broker cannot keep
            # up, the offered rate drops instead of a backlog growing without bound.
            while len(self._pubs) >= OUTSTANDING:
                await self._pubs.pop(0)
            self._pubs.append(asyncio.create_task(self._one(self.sent)))
            self.sent += 1
        self.elapsed = loop.time() - start

    async def stop(self) -> int:
        """Stop; wait for every publish's answer; the number published."""
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, GUARD)
        await asyncio.wait_for(asyncio.gather(*self._pubs), GUARD)
        return self.sent


class Arrivals:
    """What ``agent``'s application receives, each with the loop time it arrived, in
    order; awaitable by count (no polling)."""

    def __init__(self, agent: Agent) -> None:
        self.received: list[tuple[float, dict[str, Any]]] = []
        self._arrived = asyncio.Event()
        self._inbox = agent.listen()
        self._task = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            record = await self._inbox.get()
            self.received.append((loop.time(), record))
            self._arrived.set()

    async def at_least(self, count: int, *, idle: float | None = None) -> None:
        """Return once ``count`` records arrived; ``idle``: raise TimeoutError when none
        arrives for that long (a long backlog may take as long as it keeps moving)."""
        while len(self.received) < count:
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), idle)

    async def time_of(self, index: int) -> float:
        """When record ``index`` (0-based) arrived, once it has."""
        await self.at_least(index + 1)
        return self.received[index][0]

    def close(self) -> None:
        self._task.cancel()


async def start_publishing(
    a: RunningAgent, b: RunningAgent, arrivals: Arrivals, *, ttl: int, limit: int = MAX_EVENTS
) -> Publisher:
    """Once A and B are connected, subscribe A to ``handover.tick`` and start B publishing
    on it; return when A has the first notification (the publisher stopped on failure)."""
    await asyncio.wait_for(a.wait_connected(), GUARD)
    await asyncio.wait_for(b.wait_connected(), GUARD)
    await asyncio.wait_for(a.agent.subscribe("handover.tick", ttl=ttl), GUARD)
    publisher = Publisher(b, "handover.tick", RATE, limit).start()
    try:
        await asyncio.wait_for(arrivals.time_of(0), GUARD)
    except BaseException:
        with contextlib.suppress(Exception):
            await publisher.stop()
        raise
    return publisher


async def move_and_time(a: RunningAgent, arrivals: Arrivals, host: str) -> float:
    """Move A to ``host``; the restore time, from just before the move to the first
    notification A receives after it."""
    loop = asyncio.get_running_loop()
    mark = len(arrivals.received)
    changed_at = loop.time()
    await asyncio.wait_for(a.move_to(host), GUARD)
    first = await asyncio.wait_for(arrivals.time_of(mark), GUARD)
    return first - changed_at


def add_veth(ns: str, host_if: str, ns_if: str, net: str) -> None:
    """A veth pair between the root namespace (``host_if``, ``net``.1/24) and ``ns``
    (``ns_if``, ``net``.2/24), both ends up."""
    run_ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    run_ip("link", "set", ns_if, "netns", ns)
    run_ip("addr", "add", f"{net}.1/24", "dev", host_if)
    run_ip("link", "set", host_if, "up")
    run_ip("-n", ns, "addr", "add", f"{net}.2/24", "dev", ns_if)
    run_ip("-n", ns, "link", "set", ns_if, "up")


async def stream_to_child(a_sock: Path, b: RunningAgent, subject: str) -> tuple[Tail, Publisher]:
    """Once A (a child process, API at ``a_sock``) and B are connected, subscribe A to
    ``subject`` and have B publish on it at 100/s; return A's tail and B's publisher when
    A has received 20 (both stopped on failure)."""
    await wait_status(a_sock, is_connected)
    await asyncio.wait_for(b.wait_connected(), GUARD)
    async with ApiClient(a_sock) as client:
        await client.call({"op": "sub", "subject": subject, "ttl": 600})
    tail = await Tail(a_sock).start()
    publisher = Publisher(b, subject, 100.0).start()
    try:
        await asyncio.wait_for(tail.wait_count(20), GUARD)
    except BaseException:
        await tail.close()
        with contextlib.suppress(Exception):
            await publisher.stop()
        raise
    return tail, publisher


async def close_netns_run(
    tail: Tail | None,
    publisher: Publisher | None,
    a: Child | None,
    b: RunningAgent | None,
    broker: RunningBroker | None,
    ns: str,
    host_ifs: tuple[str, ...],
) -> None:
    """Stop what a network-namespace run started, then delete the namespace and its
    veth ends (normally gone with the namespace)."""
    if tail is not None:
        await tail.close()
    if publisher is not None:
        with contextlib.suppress(Exception):
            await publisher.stop()
    if a is not None:
        await stop(a)
    if b is not None:
        await b.close()
    if broker is not None:
        await broker.close()
    with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
        run_ip("netns", "del", ns)
    for host_if in host_ifs:
        with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
            run_ip("link", "del", host_if)


@pytest.mark.parametrize("transport", ["rudp", "quic"])
async def test_hundred_moves_while_publishing_lose_and_repeat_nothing(
    tmp_path: Path,
    store: BrokerStore,
    sip_stack: str,
    transport: str,
) -> None:
    sink = WaitingSink()
    broker = await _broker(tmp_path, store, sink, transports=(transport,))
    port = broker.sip_addr[1]
    a = await run_agent(
        agent_config(
            tmp_path / "alice", "alice", A_HOSTS[0], port, stack=sip_stack, transport=transport
        ),
        address_source=lo_only,
    )
    b = await run_agent(
        agent_config(
            tmp_path / "bob", "bob", "127.0.0.100", port, stack=sip_stack, transport=transport
        ),
        address_source=lo_only,
    )
    publisher: Publisher | None = None
    arrivals = Arrivals(a.agent)
    received = arrivals.received
    try:
        publisher = await start_publishing(a, b, arrivals, ttl=600)
        assert a.status().media_transport == transport
        quic = a.agent.quic_media
        assert quic is not None
        connection = quic.peer  # over QUIC: one connection, migrated at every move
        assert (connection is None) == (transport == "rudp")
        restore: list[float] = []
        for k in range(1, MOVES + 1):
            host = A_HOSTS[k % len(A_HOSTS)]
            restore.append(await move_and_time(a, arrivals, host))
            assert a.status().media_addr.startswith(host + ":")
        sent = await publisher.stop()
        publisher_elapsed = publisher.elapsed
        publisher = None

        await asyncio.wait_for(arrivals.at_least(sent), GUARD)
        records = [r for _, r in received]
        check_exactly(records, [f"t{i}" for i in range(sent)])
        assert [r["nseq"] for r in records] == list(range(1, sent + 1))
        assert a.agent.delivered_since(0)[-1]["nseq"] == sent
        await asyncio.wait_for(
            sink.wait_for("notify_delivered", "sip:alice@localhost", count=sent), GUARD
        )
        await broker.service.settled()  # the held ack is applied after the last event
        assert store.queues.depth("sip:alice@localhost") == 0
        assert a.agent.event_counts["ip_changed"] == MOVES
        assert quic.peer is connection
        if transport == "quic":
            link = broker.service._users["sip:alice@localhost"]
            assert link.peer.transport == "quic" and link.peer.path_changes >= MOVES // 2
        p50, p99 = percentile(restore, 0.5), percentile(restore, 0.99)
        rate = sent / publisher_elapsed if publisher_elapsed > 0 else 0.0
        print(
            f"\nhandover ({sip_stack}, {transport}): {MOVES} moves while B published {sent} events "
            f"({rate:.0f}/s, target {RATE:.0f}/s): 0 lost, 0 duplicated, order kept; restore time "
            f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {max(restore) * 1000:.1f} ms"
        )
    finally:
        arrivals.close()
        if publisher is not None:
            with contextlib.suppress(Exception):
                await publisher.stop()
        await a.close()
        await b.close()
        await broker.close()


# ------------------------------------------------------------------ network namespace


async def test_address_change_inside_a_network_namespace(
    tmp_path: Path,
    store: BrokerStore,
    sip_stack: str,
) -> None:
    require_netns()
    tag = os.getpid() % 10000
    net = f"10.77.{20 + os.getpid() % 200}"
    ns, host_if, ns_if = f"mdeci-e2ea-{tag}", f"mde{tag}h", f"mde{tag}n"
    old, new = f"{net}.2", f"{net}.3"
    a: Child | None = None
    b: RunningAgent | None = None
    broker: RunningBroker | None = None
    publisher: Publisher | None = None
    tail: Tail | None = None
    try:
        run_ip("netns", "add", ns)
        add_veth(ns, host_if, ns_if, net)
        run_ip("-n", ns, "link", "set", "lo", "up")

        sink = WaitingSink()
        broker = await _broker(tmp_path, store, sink, host=f"{net}.1")
        sip = broker.sip_addr
        a, a_sock = await start_agent(
            tmp_path,
            "alice",
            agent_toml(
                tmp_path / "alice",
                "alice",
                old,
                sip,
                ip_monitor='mode = "netlink"\npoll_interval = 1.0',
                stack=sip_stack,
            ),
            prefix=("ip", "netns", "exec", ns),
        )
        b = await run_agent(
            agent_config(tmp_path / "bob", "bob", f"{net}.1", sip[1], f"{net}.1", sip_stack),
            address_source=lo_only,
        )
        tail, publisher = await stream_to_child(a_sock, b, "netns.tick")

        # The address goes away under the running agent, and another one comes.
        run_ip("-n", ns, "addr", "del", f"{old}/24", "dev", ns_if)
        run_ip("-n", ns, "addr", "add", f"{new}/24", "dev", ns_if)
        # move_to rebinds RUDP before SIP: wait for both (status may show one moved).
        await wait_status(
            a_sock,
            lambda s: s["media_addr"].startswith(new + ":") and s["sip_addr"].startswith(new + ":"),
        )
        await asyncio.wait_for(sink.wait_for("session_reinvited", "sip:alice@localhost"), GUARD)
        mark = len(tail.records)
        await asyncio.wait_for(tail.wait_count(mark + 20), GUARD)  # resumed at the new one
        sent = await publisher.stop()
        publisher = None
        records = await asyncio.wait_for(tail.wait_count(sent), GUARD)
        check_exactly(records, [f"t{i}" for i in range(sent)])
        status = await wait_status(a_sock, lambda s: s["highest_nseq"] >= sent)
        assert status["highest_nseq"] == sent and status["status"] == "CONNECTED"
        log = (tmp_path / "alice" / "churn.log").read_text()
        assert '"event":"ip_changed"' in log and new in log
        print(
            f"\nnetns ({sip_stack}): {ns_if} {old} -> {new} under the agent; "
            f"{sent} events, 0 lost, 0 dup"
        )
    finally:
        await close_netns_run(tail, publisher, a, b, broker, ns, (host_if,))


def _churn(path: Path, event: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r["event"] == event]


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def _detections(child: Child) -> list[tuple[float, str]]:
    """The agent's ``move_detected`` operator lines (time, addr), from its stderr."""
    found = []
    for line in child.stderr().splitlines():
        fields = dict(word.partition("=")[::2] for word in line.split())
        if fields.get("event") == "move_detected":
            found.append((_epoch(fields["ts"]), fields["addr"]))
    return found


async def test_default_route_from_wifi_to_cell_then_wifi_down(
    tmp_path: Path,
    store: BrokerStore,
) -> None:
    """The agent follows the default route across interfaces.

    The device namespace has two veths, ``wifi`` and ``cell``, each paired with one in
    the root namespace. The broker's address is a /32 on the root side of ``cell``:
    off-link for the device on both interfaces, so only the default route decides which
    one (and which source address) reaches it (the root namespace takes packets for a
    local address on any interface). The agent (``mdeci agent`` in the namespace,
    netlink mode, a 30 s poll interval so that only netlink events can make it move in
    time) starts on Wi-Fi; the default route is replaced by one via ``cell``; then
    ``wifi`` goes down. Times are wall-clock, from just before ``ip route replace`` to
    the agent's ``move_detected`` line (ms resolution): the ``ip`` process start is
    counted, so the measure errs long.
    """
    require_netns()
    tag = os.getpid() % 10000
    n = 20 + os.getpid() % 200
    ns, wifi_h, cell_h = f"mdeci-e2ew-{tag}", f"mdw{tag}", f"mdc{tag}"
    wifi_ip, cell_ip, broker_ip = f"10.78.{n}.2", f"10.79.{n}.2", f"10.80.{n}.1"
    a: Child | None = None
    b: RunningAgent | None = None
    broker: RunningBroker | None = None
    publisher: Publisher | None = None
    tail: Tail | None = None
    try:
        run_ip("netns", "add", ns)
        add_veth(ns, wifi_h, "wifi", f"10.78.{n}")
        add_veth(ns, cell_h, "cell", f"10.79.{n}")
        run_ip("addr", "add", f"{broker_ip}/32", "dev", cell_h)
        run_ip("-n", ns, "link", "set", "lo", "up")
        run_ip("-n", ns, "route", "add", "default", "via", f"10.78.{n}.1", "dev", "wifi")

        sink = WaitingSink()
        broker = await _broker(tmp_path, store, sink, host=broker_ip)
        sip = broker.sip_addr
        a, a_sock = await start_agent(
            tmp_path,
            "alice",
            agent_toml(
                tmp_path / "alice",
                "alice",
                wifi_ip,
                sip,
                ip_monitor='mode = "netlink"\npoll_interval = 30.0',
            ),
            prefix=("ip", "netns", "exec", ns),
        )
        b = await run_agent(
            agent_config(tmp_path / "bob", "bob", broker_ip, sip[1], broker_ip),
            address_source=lo_only,
        )
        tail, publisher = await stream_to_child(a_sock, b, "roam.tick")
        aor = "sip:alice@localhost"
        assert [x.contact for x in store.bindings.bindings(aor, time.time())] != []
        assert all(wifi_ip in x.contact for x in store.bindings.bindings(aor, time.time()))

        # Wi-Fi -> cellular: one RTM_NEWROUTE (NLM_F_REPLACE), the addresses unchanged.
        changed_at = time.time()  # before the change: the measure can only be longer
        run_ip("-n", ns, "route", "replace", "default", "via", f"10.79.{n}.1", "dev", "cell")
        await wait_status(
            a_sock,
            lambda s: (
                s["media_addr"].startswith(cell_ip + ":")
                and s["sip_addr"].startswith(cell_ip + ":")
            ),
        )
        await asyncio.wait_for(sink.wait_for("session_reinvited", aor), GUARD)
        await asyncio.wait_for(sink.wait_for("unregistered", aor), GUARD)  # the Wi-Fi contact
        churn = tmp_path / "alice" / "churn.log"
        moves = _churn(churn, "ip_changed")
        assert len(moves) == 1 and moves[0]["addr"].startswith(cell_ip + ":"), moves
        # Detected: the operator line written when the monitor names the new address;
        # moved: ip_changed, written once REGISTER from there is answered.
        detections = _detections(a)
        assert [addr for _, addr in detections] == [cell_ip], detections
        detected = detections[0][0] - changed_at
        moved = _epoch(moves[0]["ts"]) - changed_at
        mark = len(tail.records)
        await asyncio.wait_for(tail.wait_count(mark + 20), GUARD)  # flowing over cell

        # Wi-Fi goes away altogether: the agent is already on cell, nothing moves.
        run_ip("-n", ns, "link", "set", "wifi", "down")
        mark = len(tail.records)
        await asyncio.wait_for(tail.wait_count(mark + 20), GUARD)
        sent = await publisher.stop()
        publisher = None
        records = await asyncio.wait_for(tail.wait_count(sent), GUARD)
        check_exactly(records, [f"t{i}" for i in range(sent)])
        status = await wait_status(a_sock, lambda s: s["highest_nseq"] >= sent)
        assert status["highest_nseq"] == sent and status["status"] == "CONNECTED"
        assert status["sip_addr"].startswith(cell_ip + ":")
        assert len(_churn(churn, "ip_changed")) == 1
        assert len(_detections(a)) == 1
        contacts = [x.contact for x in store.bindings.bindings(aor, time.time())]
        assert len(contacts) == 1 and cell_ip in contacts[0], contacts
        assert detected < 0.2, f"move detected {detected * 1000:.0f} ms after the route change"
        print(
            f"\nroaming: default route wifi -> cell, then wifi down: move detected in "
            f"{detected * 1000:.0f} ms, moved (REGISTER answered) in {moved * 1000:.0f} ms; "
            f"{sent} events, 0 lost, 0 dup, 1 contact left ({contacts[0]})"
        )
    finally:
        await close_netns_run(tail, publisher, a, b, broker, ns, (wifi_h, cell_h))


# ------------------------------------------------------------- netlink inside the loop


async def test_netlink_monitor_works_inside_the_running_loop() -> None:
    """pyroute2's synchronous API runs its own asyncio loop, which raises "This event loop
    is already running" when called from the agent's running loop; the netlink monitor
    (mdeci/agent/ipmonitor.py) must work there, or ``mdeci agent`` cannot start with the
    default ``ip_monitor``."""
    source = netlink_source("127.0.0.1")
    assert is_held("127.0.0.1", source())
    monitor = make_monitor(IpMonitorConfig(mode=IpMonitorMode.NETLINK), "127.0.0.1")
    assert monitor is not None and monitor.check() is None
