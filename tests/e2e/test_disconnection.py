"""A silenced agent, the broker's DISCONNECTED state, the bounded queue with
drop-oldest, and the in-order drain on resume.

The broker runs in-process (its churn events are awaited on a sink, its session status
read from the store); A is a ``python -m mdeci agent`` child silenced with SIGSTOP and
resumed with SIGCONT; B is an in-process agent. The broker's RUDP gives up after
~0.35 s (``FAST_RUDP`` of the agent tests), and on QUIC (the ``transport`` fixture) the
idle timeout is 1 s (``QUIC_MEDIA``), so DISCONNECTED comes early in the silence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path

import pytest

from mdeci.agent.api import ApiClient
from mdeci.agent.daemon import RunningAgent, run_agent
from mdeci.broker.app import RunningBroker, run_broker
from mdeci.config import (
    AuthConfig,
    BrokerConfig,
    BrokerMediaConfig,
    OverflowPolicy,
    QueueConfig,
    SipConfig,
    UserConfig,
)
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from tests.agent.farend import FAST_RUDP, agent_config, lo_only
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
    start_agent,
    stop,
    wait_status,
)
from tests.store.conftest import sqlite_path as sqlite_path
from tests.store.conftest import sqlite_template as sqlite_template

ALICE = "sip:alice@localhost"
QUEUE_MAX = 50
BEFORE = 5  # delivered before the silence
DURING = 80  # published during the silence: 30 more than the queue holds
# A's RUDP pings an idle broker every 0.5 s, so after SIGCONT it hears within a second
# whether its media session still stands.
A_RUDP = (
    "rto_initial = 0.2\nrto_min = 0.05\nrto_max = 1.0\nmax_retries = 4\n"
    "ack_delay = 0.002\nkeepalive_interval = 0.5"
)
# QUIC's counterpart on both ends: a PING every 0.3 s, gone after 1 s without a packet.
QUIC_MEDIA = BrokerMediaConfig(
    host="127.0.0.1", transports=("quic",), quic_idle_timeout=1.0, quic_keepalive=0.3
)
QUIC_AGENT_MEDIA = "quic_idle_timeout = 1.0\nquic_keepalive = 0.3"


async def _broker(
    tmp: Path, store: BrokerStore, sink: WaitingSink, transport: str
) -> RunningBroker:
    config = BrokerConfig(
        domain="localhost",
        data_dir=tmp / "broker",
        sip=SipConfig(host="127.0.0.1", port=0, t1=0.05, t2=0.4, t4=0.5),
        rudp=FAST_RUDP,
        media=QUIC_MEDIA if transport == "quic" else BrokerMediaConfig(),
        queue=QueueConfig(max_per_uri=QUEUE_MAX, overflow=OverflowPolicy.DROP_OLDEST),
        auth=AuthConfig(
            users=tuple(UserConfig(user=u, password=f"{u}-secret") for u in ("alice", "bob"))
        ),
    )
    return await run_broker(
        config, sip_listen=("127.0.0.1", 0), media_listen=("127.0.0.1", 0), store=store, log=sink
    )


@pytest.mark.parametrize(
    "silence",
    [
        pytest.param(2.0, id="2s"),
        # Half a minute of real silence: a long run, in ``make bench``.
        pytest.param(30.0, id="30s", marks=[pytest.mark.slow, pytest.mark.bench]),
    ],
)
async def test_silenced_agent_is_disconnected_queued_and_drained_in_order(
    tmp_path: Path,
    store: BrokerStore,
    silence: float,
    sip_stack: str,
    transport: str,
) -> None:
    sink = WaitingSink()
    broker = await _broker(tmp_path, store, sink, transport)
    sip = broker.sip_addr
    a: Child | None = None
    b: RunningAgent | None = None
    tail: Tail | None = None
    loop = asyncio.get_running_loop()
    try:
        a, a_sock = await start_agent(
            tmp_path,
            "alice",
            agent_toml(
                tmp_path / "alice",
                "alice",
                "127.0.0.2",
                sip,
                rudp=A_RUDP,
                stack=sip_stack,
                transport=transport,
                media=QUIC_AGENT_MEDIA,
            ),
        )
        bob = agent_config(tmp_path / "bob", "bob", "127.0.0.4", sip[1])
        b = await run_agent(
            dataclasses.replace(
                bob,
                sip=dataclasses.replace(bob.sip, stack=sip_stack),
                media=dataclasses.replace(bob.media, transport=transport),
            ),
            address_source=lo_only,
        )
        await wait_status(a_sock, is_connected)
        await asyncio.wait_for(b.wait_connected(), GUARD)
        async with ApiClient(a_sock) as client:
            await client.call({"op": "sub", "subject": "alerts.*", "ttl": 600})
        tail = await Tail(a_sock).start()

        async def publish(i: int) -> None:
            assert b is not None
            result = await asyncio.wait_for(
                b.agent.publish("alerts.fire", {"i": i}, f"n{i}".encode()), GUARD
            )
            assert (result.state, result.matched) == ("published", 1)

        for i in range(BEFORE):
            await publish(i)
        await asyncio.wait_for(tail.wait_count(BEFORE), GUARD)

        # Silence A: its process stops; its sockets stay bound but nobody answers.
        os.kill(a.pid, signal.SIGSTOP)
        silenced_at = loop.time()
        await publish(BEFORE)
        gone = await asyncio.wait_for(sink.wait_for("media_disconnected", ALICE), GUARD)
        assert str(gone.fields.get("reason", "")).startswith(f"{transport}:"), gone
        session = store.sessions.get_session(ALICE)
        assert session is not None and session.status is SessionStatus.DISCONNECTED
        assert not broker.service.is_connected(ALICE)
        for i in range(BEFORE + 1, BEFORE + DURING):
            await publish(i)

        # The queue holds the newest QUEUE_MAX; every drop is logged.
        dropped = sink.named("notify_dropped")
        assert len(dropped) == DURING - QUEUE_MAX
        assert all(e.uri == ALICE for e in dropped)
        assert store.queues.depth(ALICE) == QUEUE_MAX
        # The oldest went first: nseq BEFORE+1 .. BEFORE+30.
        dropped_nseqs = [e.fields.get("nseq") for e in dropped]
        assert dropped_nseqs == list(range(BEFORE + 1, BEFORE + 1 + DURING - QUEUE_MAX))

        # Keep A silent for the whole period (the scenario's length, not a synchronisation).
        await asyncio.sleep(max(0.0, silence - (loop.time() - silenced_at)))
        os.kill(a.pid, signal.SIGCONT)

        survivors = [f"n{i}" for i in range(BEFORE + DURING - QUEUE_MAX, BEFORE + DURING)]
        await asyncio.wait_for(
            tail.wait_until(lambda rs: bool(rs) and rs[-1].get("text") == survivors[-1]), GUARD
        )
        records = tail.records
        # The notification whose retries made the broker give up (n{BEFORE}) sat in A's
        # socket buffer while A was stopped; A may read it on resume, before the queue's
        # survivors (the queue had dropped it as the oldest, so it comes only that way).
        in_flight = [f"n{BEFORE}"] if records[BEFORE].get("text") == f"n{BEFORE}" else []
        check_exactly(records, [f"n{i}" for i in range(BEFORE)] + in_flight + survivors)
        resumed = records[BEFORE + len(in_flight) :]
        # A is told how many it missed, once, on the first notification after the gap.
        assert resumed[0]["missed"] == DURING - QUEUE_MAX
        assert all(r["missed"] == 0 for r in resumed[1:])
        await asyncio.wait_for(sink.wait_for("media_connected", ALICE, count=2), GUARD)
        status = await wait_status(a_sock, lambda s: s["highest_nseq"] == BEFORE + DURING)
        assert (status["status"], status["media_transport"]) == ("CONNECTED", transport)
        await asyncio.wait_for(
            sink.wait_for("notify_delivered", ALICE, count=BEFORE + QUEUE_MAX), GUARD
        )
        await broker.service.settled()  # the held ack is applied after the last event
        assert store.queues.depth(ALICE) == 0
        print(f"\nsilence {silence:.0f} s: {len(dropped)} dropped, {QUEUE_MAX} drained in order")
    finally:
        if tail is not None:
            await tail.close()
        if a is not None:
            await stop(a)
        if b is not None:
            await b.close()
        await broker.close()
