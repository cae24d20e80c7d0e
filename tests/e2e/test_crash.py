"""``kill -9`` of the broker, then of an agent, with real processes.

Broker crash mid-stream (bob publishing, alice receiving), restarted on the same ports and
database: every publish that got ``pub-ok`` reaches alice's application, nothing is handed
to it twice (what ``tail`` hands over is collected across the whole run), and both agents
come back by themselves. Agent crash (alice): restarted with the same config and state
directory, ``mdeci subs`` shows its subscription again, what was queued meanwhile
arrives, and nothing already handed over is handed over again (its nseq state on disk).

Both data channels (the ``transport`` fixture). On QUIC the restarted broker BYEs each
session it reads back (the connection died with it), and the agents INVITE again at once
instead of waiting for QUIC's idle timeout.

SQLite always; PostgreSQL too when ``MDECI_TEST_PG_URL`` is set (a schema of its own).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.ipmonitor import make_monitor
from mdeci.config import IpMonitorConfig, IpMonitorMode
from tests.e2e.harness_b import (
    AgentProcess,
    BrokerProcess,
    TailCollector,
    drop_pg_schema,
    eventually,
    pg_schema_url,
)
from tests.peers import pg_url

BEFORE = 15  # publishes before the crash
DURING = 10  # publishes while the process is dead (or dying)
AFTER = 5  # publishes once it is back


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None (the broker's default SQLite file in its data_dir), or a fresh PG schema."""
    if request.param == "sqlite":
        yield None
        return
    base = pg_url()
    schema, url = pg_schema_url(base)
    try:
        yield url
    finally:
        drop_pg_schema(base, schema)


def _assert_once(records: list[dict[str, Any]]) -> None:
    nseqs = Counter(int(r["nseq"]) for r in records)
    msg_ids = Counter(str(r["msg_id"]) for r in records)
    assert [n for n, c in nseqs.items() if c > 1] == []
    assert [m for m, c in msg_ids.items() if c > 1] == []
    assert [int(r["nseq"]) for r in records] == sorted(nseqs)


def _delivered_in_churn_log(agent: AgentProcess) -> list[int]:
    """nseqs of the agent's ``notify_delivered`` events, across all its processes."""
    lines = (agent.state_dir / "churn.log").read_text().splitlines()
    return [
        int(json.loads(line)["nseq"])
        for line in lines
        if line.strip() and json.loads(line).get("event") == "notify_delivered"
    ]


async def _publish_all(bob: AgentProcess, texts: list[str]) -> dict[str, str]:
    """text -> 'published' (pub-ok), 'sent' (no pub-ok within pub_timeout) or 'buffered'."""
    states: dict[str, str] = {}
    for text in texts:
        answer = await bob.publish("feed.prices", text, n=int(text))
        states[text] = str(answer["state"])
    return states


def _pair(
    tmp_path: Path, broker: BrokerProcess, sip_stack: str, transport: str
) -> tuple[AgentProcess, AgentProcess]:
    """Alice and bob on ``broker``, with SIP stack ``sip_stack``, over ``transport``."""
    sip = f'stack = "{sip_stack}"'
    return (
        AgentProcess(tmp_path / "a", "alice", "127.0.0.2", broker, sip=sip, transport=transport),
        AgentProcess(tmp_path / "b", "bob", "127.0.0.4", broker, sip=sip, transport=transport),
    )


def _session_ends(agent: AgentProcess) -> list[str]:
    """The reasons of the agent's ``session_ended`` events, across all its processes."""
    return [str(e.get("reason")) for e in agent.churn() if e.get("event") == "session_ended"]


def _ended_by_bye(agent: AgentProcess) -> Callable[[], Awaitable[bool]]:
    async def ended() -> bool:
        return "bye from broker" in _session_ends(agent)

    return ended


async def test_broker_kill9_mid_stream(
    tmp_path: Path, store_url: str | None, sip_stack: str, transport: str
) -> None:
    broker = BrokerProcess(tmp_path / "broker", store_url, transports=(transport,))
    await broker.start()
    alice, bob = _pair(tmp_path, broker, sip_stack, transport)
    tail: TailCollector | None = None
    try:
        await alice.start()
        await bob.start()
        await alice.wait_connected()
        await bob.wait_connected()
        await alice.subscribe("feed.*")
        tail = TailCollector(alice.socket).start()

        texts = [str(i) for i in range(BEFORE + DURING + AFTER)]
        states = await _publish_all(bob, texts[:BEFORE])
        assert set(states.values()) == {"published"}
        # Alice is receiving (some of it at least) when the broker dies.
        await tail.wait_for(lambda records: len(records) >= 1)
        await broker.kill9()
        states |= await _publish_all(bob, texts[BEFORE : BEFORE + DURING])
        assert set(states.values()) <= {"published", "sent", "buffered"}

        # Same ports, same database; nobody tells the agents anything.
        await broker.start()
        if transport == "quic":
            # Ended by the restarted broker's BYE, within the guard (as long as QUIC's
            # idle timeout, 30 s, the only other way the agents would notice).
            for agent in (alice, bob):
                await eventually(_ended_by_bye(agent))
        await bob.wait_connected()
        states |= await _publish_all(bob, texts[BEFORE + DURING :])

        acknowledged = {t for t, s in states.items() if s == "published"}
        assert set(texts[:BEFORE]) <= acknowledged
        # Bob's outbox re-sends the buffered ones, so in the end alice has every one.
        await tail.wait_for(lambda records: len(records) >= len(texts))
        await eventually_empty_outbox(bob)
        assert sorted(tail.texts, key=int) == texts
        assert acknowledged <= set(tail.texts)
        _assert_once(tail.records)
        delivered = _delivered_in_churn_log(alice)
        assert sorted(delivered) == sorted(int(r["nseq"]) for r in tail.records)
        # Seen once (a full run at load 4-5): alice DISCONNECTED here. Her churn
        # log's last events say why if it comes back.
        last = (alice.state_dir / "churn.log").read_text().splitlines()[-8:]
        status = await alice.status()
        assert (status["status"], status["media_transport"]) == ("CONNECTED", transport), last
    finally:
        if tail is not None:
            await tail.close()
        for child in (alice, bob, broker):
            await child.stop()


async def eventually_empty_outbox(agent: AgentProcess) -> None:
    async def empty() -> bool:
        return int((await agent.status())["buffered"]) == 0

    await eventually(empty)


async def test_agent_kill9_mid_stream(tmp_path: Path, sip_stack: str, transport: str) -> None:
    broker = await BrokerProcess(tmp_path / "broker", transports=(transport,)).start()
    alice, bob = _pair(tmp_path, broker, sip_stack, transport)
    tail: TailCollector | None = None
    try:
        await alice.start()
        await bob.start()
        await alice.wait_connected()
        await bob.wait_connected()
        sub_id = await alice.subscribe("feed.*", "n >= 0")
        tail = TailCollector(alice.socket).start()

        texts = [str(i) for i in range(BEFORE + DURING + AFTER)]
        states = await _publish_all(bob, texts[:BEFORE])
        await tail.wait_for(lambda records: len(records) >= 1)
        await alice.kill9()
        handed_before = len(tail.records)
        # Queued for alice while she is dead: the broker notices her silence by itself.
        states |= await _publish_all(bob, texts[BEFORE : BEFORE + DURING])

        await alice.start()  # same config, same state_dir
        await alice.wait_connected()
        code, out, err = await alice.cli("subs")
        assert (code, err) == (0, "")
        assert sub_id in out and "feed.*" in out and "cached" not in out
        states |= await _publish_all(bob, texts[BEFORE + DURING :])
        assert set(states.values()) == {"published"}

        await tail.wait_for(lambda records: len(records) >= len(texts))
        assert len(tail.records) >= handed_before
        assert sorted(tail.texts, key=int) == texts
        _assert_once(tail.records)
        # Both alice processes together handed each notification over once (the kill may
        # land between the hand-over and its log line, so a line may be missing).
        delivered = _delivered_in_churn_log(alice)
        assert len(delivered) == len(set(delivered))
        assert set(delivered) <= set(range(1, len(texts) + 1))
        # The gate a restart would take: nseq.json (a checkpoint with window 0) or the
        # inbox, whichever is higher; the inbox is fsync-ed before every ack.
        nseq_state = json.loads((alice.state_dir / "nseq.json").read_text())
        inbox = (alice.state_dir / "inbox.jsonl").read_text().splitlines()
        in_inbox = [int(json.loads(line)["nseq"]) for line in inbox if line]
        assert max(nseq_state["highest"], *in_inbox) == len(texts)
    finally:
        if tail is not None:
            await tail.close()
        for child in (alice, bob, broker):
            await child.stop()


async def test_netlink_address_source_works_inside_the_event_loop() -> None:
    """``mdeci agent`` builds its IP monitor inside its running event loop, where pyroute2's
    synchronous API raises "This event loop is already running": the monitor must not
    call it there, or the daemon does not start at all."""
    monitor = make_monitor(IpMonitorConfig(mode=IpMonitorMode.NETLINK), "127.0.0.2")
    assert monitor is not None
    assert monitor.check() is None  # 127.0.0.2 is still held by lo's 127.0.0.1/8
