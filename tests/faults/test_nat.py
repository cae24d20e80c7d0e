"""A device behind a real NAT (:mod:`tests.faults.natlab`): nftables masquerade in a router
namespace, whose UDP mappings expire after :data:`UDP_TIMEOUT` seconds of silence.

alice's agent runs in the device namespace with a RUDP keepalive of
:data:`KEEPALIVE` seconds; the broker and bob run in the root namespace. The session comes
up through the NAT; alice stays idle for three keepalive periods (longer than the mapping
lives without traffic) and still gets a notification at once, through the same mapping;
then, while bob publishes, the NAT rebinds alice to a new port (new masquerade range,
conntrack entries deleted): the broker validates the new path and alice gets every
notification once, in order. The run (once per module) is shared by the tests below.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness_a import (
    FAST_RUDP,
    GUARD,
    Child,
    agent_toml,
    broker_toml,
    check_exactly,
    spawn,
    start_agent,
    wait_status,
)
from tests.faults.children import Run
from tests.faults.natlab import FIRST_PORTS, REBOUND_PORTS, Mapping, NatLab
from tests.faults.publisher import ApiLine, RetryingPublisher

pytestmark = pytest.mark.slow

KEEPALIVE = 1.0  # seconds: alice's RUDP keepalive interval
UDP_TIMEOUT = 3  # seconds a UDP mapping of the NAT lives without traffic
IDLE_PERIODS = 3
SUBJECT = "faults.nat"
WARM = 5  # notifications before the idle period
REBIND_COUNT = 150  # published at REBIND_RATE while the NAT rebinds
REBIND_RATE = 50.0
REBIND_AFTER = 40  # publishes taken before the rebinding


@dataclass(frozen=True)
class NatRun:
    media_port: int  # the broker's RUDP port
    before_idle: list[Mapping]
    after_idle: list[Mapping]
    after_rebind: list[Mapping]
    published: list[str]
    received: list[dict[str, Any]]
    alice_status: dict[str, Any]
    alice_churn: list[dict[str, Any]]
    broker_log: str


def _flow(mappings: list[Mapping], peer_port: int) -> list[Mapping]:
    return [m for m in mappings if m.peer_port == peer_port]


async def _publish(line: ApiLine, text: str) -> None:
    answer = await line.call({"op": "pub", "subject": SUBJECT, "attrs": {}, "text": text})
    assert answer.get("ok") and answer["state"] == "published", answer


async def _spawn_broker(tmp: Path, config: Path, host: str) -> tuple[Child, None]:
    broker = await spawn(
        "broker",
        ["broker", "--config", str(config), "--listen-sip", f"{host}:0",
         "--listen-media", f"{host}:0"],
        tmp / "logs",
    )  # fmt: skip
    return broker, None


async def _run(tmp: Path) -> NatRun:
    lab = NatLab(UDP_TIMEOUT)
    async with Run(tmp) as run:
        run.on_exit(lab.close)
        await asyncio.to_thread(lab.open)
        config = tmp / "broker.toml"
        config.write_text(
            broker_toml(tmp / "broker").replace('host = "127.0.0.1"', f'host = "{lab.broker_ip}"')
        )
        broker, _ = await run.child(_spawn_broker(tmp, config, lab.broker_ip))
        sip_host, _, sip_port = broker.words["sip"].rpartition(":")
        sip = (sip_host, int(sip_port))
        media_port = int(broker.words["media"].rpartition(":")[2])
        rudp = f"{FAST_RUDP}\nkeepalive_interval = {KEEPALIVE}"
        (_, a_sock), (_, b_sock) = await run.subscribed_pair(
            start_agent(
                tmp,
                "alice",
                agent_toml(tmp / "alice", "alice", lab.device_ip, sip, rudp=rudp),
                prefix=("ip", "netns", "exec", lab.device_ns),
            ),
            start_agent(tmp, "bob", agent_toml(tmp / "bob", "bob", lab.broker_ip, sip)),
            SUBJECT,
        )
        tail = await run.tail(a_sock)
        line = await run.line(b_sock)
        published = []
        for i in range(WARM):
            published.append(f"w{i}")
            await _publish(line, published[-1])
        await asyncio.wait_for(tail.wait_count(WARM), GUARD)
        before_idle = _flow(await asyncio.to_thread(lab.mappings), media_port)

        # Idle: nothing but keepalives for three periods, longer than a silent mapping lives.
        await asyncio.sleep(IDLE_PERIODS * KEEPALIVE + 1.0)
        after_idle = _flow(await asyncio.to_thread(lab.mappings), media_port)
        published.append("idle")
        await _publish(line, "idle")
        await asyncio.wait_for(tail.wait_count(WARM + 1), GUARD)

        publisher = run.publisher(
            RetryingPublisher(b_sock, SUBJECT, REBIND_COUNT, REBIND_RATE, prefix="r")
        )
        await publisher.wait(taken=REBIND_AFTER)
        await asyncio.to_thread(lab.rebind)
        await publisher.finish()
        published += publisher.taken
        await asyncio.wait_for(tail.wait_count(len(published)), GUARD)
        status = await wait_status(a_sock, lambda s: s["highest_nseq"] >= len(published))
        after_rebind = _flow(await asyncio.to_thread(lab.mappings), media_port)
        churn_path = tmp / "alice" / "churn.log"
        churn = [json.loads(x) for x in churn_path.read_text().splitlines() if x.strip()]
        return NatRun(
            media_port=media_port,
            before_idle=before_idle,
            after_idle=after_idle,
            after_rebind=after_rebind,
            published=published,
            received=list(tail.records),
            alice_status=status,
            alice_churn=churn,
            broker_log=broker.stderr(),
        )


@pytest.fixture(scope="module")
def nat() -> Iterator[NatRun]:
    with tempfile.TemporaryDirectory(prefix="mdeci-faults-nat-") as tmp:
        yield asyncio.run(_run(Path(tmp)))


def _in(ports: tuple[int, int], mapping: Mapping) -> bool:
    return ports[0] <= mapping.public_port <= ports[1]


def test_session_comes_up_through_the_nat(nat: NatRun) -> None:
    assert len(nat.before_idle) == 1, nat.before_idle
    assert _in(FIRST_PORTS, nat.before_idle[0])  # the broker sees the NAT's port
    check_exactly(nat.received[:WARM], [f"w{i}" for i in range(WARM)])


def test_keepalives_hold_the_binding_across_three_idle_periods(nat: NatRun) -> None:
    # The very same conntrack entry: it never expired, although a silent one lives 3 s.
    assert nat.after_idle == nat.before_idle, (nat.before_idle, nat.after_idle)
    assert nat.received[WARM]["text"] == "idle"


def test_nat_rebinding_loses_and_duplicates_nothing(nat: NatRun) -> None:
    assert len(nat.after_rebind) == 1 and _in(REBOUND_PORTS, nat.after_rebind[0])
    check_exactly(nat.received, nat.published)
    assert nat.alice_status["status"] == "CONNECTED"
    # The device never saw the rebinding: one session, never lost.
    events = [r["event"] for r in nat.alice_churn]
    assert events.count("media_connected") == 1, events
    assert "media_lost" not in events and "session_ended" not in events, events
    print(
        f"\nNAT: idle {IDLE_PERIODS} x {KEEPALIVE:.0f} s keepalive held port "
        f"{nat.before_idle[0].public_port}; rebound to {nat.after_rebind[0].public_port} "
        f"while {REBIND_COUNT} were published at {REBIND_RATE:.0f}/s: 0 lost, 0 duplicated"
    )


def test_the_rebinding_is_in_the_broker_log(nat: NatRun) -> None:
    new_port = nat.after_rebind[0].public_port
    lines = [x for x in nat.broker_log.splitlines() if str(new_port) in x]
    assert any("path" in x or "moved" in x for x in lines), nat.broker_log[-3000:]
