"""Matching end to end with real processes on loopback.

``python -m mdeci broker`` and two ``python -m mdeci agent`` children; A subscribes
through ``python -m mdeci sub``; B publishes 1,000 deterministic events through its
local API; A's application (a ``tail`` on A's API socket) gets exactly the matching
subset, in order; over each data channel (``[media] transport``, docs/sip.md): RUDP and
QUIC.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mdeci.agent.api import ApiClient
from tests.e2e.harness_a import (
    GUARD,
    STOCK_FILTER,
    Child,
    Tail,
    agent_toml,
    broker_toml,
    check_exactly,
    is_connected,
    run_cli,
    start_agent,
    start_broker,
    stock_event,
    stock_matches,
    stop,
    wait_status,
)

EVENTS = 1000


@pytest.mark.parametrize("transport", ["rudp", "quic"])
async def test_a_gets_exactly_the_matching_subset_in_order(
    tmp_path: Path, sip_stack: str, transport: str
) -> None:
    children: list[Child] = []
    tail: Tail | None = None
    try:
        broker_config = broker_toml(tmp_path / "broker", transports=(transport,))
        broker, sip = await start_broker(tmp_path, broker_config)
        children.append(broker)
        for name, host in (("alice", "127.0.0.2"), ("bob", "127.0.0.4")):
            config = agent_toml(
                tmp_path / name, name, host, sip, stack=sip_stack, transport=transport
            )
            children.append((await start_agent(tmp_path, name, config))[0])
        a_sock, b_sock = (Path(child.words["api"]) for child in children[1:])
        for sock in (a_sock, b_sock):
            status = await wait_status(sock, is_connected)
            assert status["media_transport"] == transport

        out = await run_cli(
            "sub", "StockExchange", "--filter", STOCK_FILTER, "--ttl", "600",
            "--socket", str(a_sock),
        )  # fmt: skip
        assert out.startswith("subscribed "), out
        subs = await run_cli("subs", "--socket", str(a_sock))
        assert "StockExchange" in subs and "PETR4" in subs

        tail = await Tail(a_sock).start()
        events = [stock_event(i) for i in range(EVENTS)]
        expected = [f"e{i}" for i, attrs in enumerate(events) if stock_matches(attrs)]
        # The stream is built so the subset is neither empty nor everything.
        assert 0 < len(expected) < EVENTS // 5

        t0 = asyncio.get_running_loop().time()
        matched = 0
        async with ApiClient(b_sock) as client:
            for i, attrs in enumerate(events):
                answer = await asyncio.wait_for(
                    client.call(
                        {"op": "pub", "subject": "StockExchange", "attrs": attrs, "text": f"e{i}"}
                    ),
                    GUARD,
                )
                assert answer["state"] == "published", answer
                matched += int(answer["matched"])
        took = asyncio.get_running_loop().time() - t0
        print(f"\nB published {EVENTS} events through its API in {took:.1f} s")
        # Every pub-ok counted the broker's matches: exactly the expected subset matched.
        assert matched == len(expected)

        records = await asyncio.wait_for(tail.wait_count(len(expected)), GUARD)
        check_exactly(records, expected)
        assert [r["nseq"] for r in records] == list(range(1, len(expected) + 1))
        for record in records:
            assert record["subject"] == "StockExchange"
            assert stock_matches(record["attrs"]), record
            assert record["missed"] == 0
        # Nothing beyond the subset was handed to A's application.
        status = await wait_status(a_sock, lambda s: s["highest_nseq"] >= len(expected))
        assert status["highest_nseq"] == len(expected)
        assert len(tail.records) == len(expected)
    finally:
        if tail is not None:
            await tail.close()
        for child in reversed(children):
            code = await stop(child)
            assert code == 0, f"{child.name} exited {code}: {child.stderr()}"
