"""The data channel's negotiation end to end (docs/sip.md), with real processes on
loopback: agents on ``[media] transport = "auto"`` offer QUIC and RUDP and get the one
the broker's ``[media] transports`` takes, then deliver over it (nothing lost, nothing
duplicated, order kept); an agent offering only a transport the broker does not take is
answered 488 and stays DISCONNECTED, saying why.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mdeci.agent.api import ApiClient
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
