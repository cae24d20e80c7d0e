"""A broker killed (``kill -9``) while its agents are idle, then restarted.

Alice runs with the SIP timers and back-off of a real deployment (T1 0.5 s, back-off
from 1 s) and a liveness bound of ``keepalive_interval + dead_after``: she must say
DISCONNECTED within it (``mdeci status`` exits 1; ``mdeci admin sessions`` says that
the CONNECTED it reads from the store has no broker behind it, and alice's churn log
has the ``broker_lost`` the churn jobs count), and once the broker is back on the
same ports and database, a notification bob publishes must reach her within 1 s of the
broker's ready line, which her own SIP retries (INVITE retransmitted after 0.5, 1.5,
3.5, 7.5 s) would not do: the restarted broker reaches her first.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.e2e.harness_b import (
    AgentProcess,
    BrokerProcess,
    TailCollector,
    eventually,
)

KEEPALIVE = 1.0
DEAD_AFTER = 1.0
BOUND = KEEPALIVE + DEAD_AFTER  # docs/agent.md "Noticing a dead broker"
SLACK = 1.0  # the test's own polling and a loaded machine's scheduling
DEPLOYED = (
    "t1 = 0.5\nt2 = 4.0\nt4 = 5.0\n",
    f"[rudp]\nkeepalive_interval = {KEEPALIVE}\ndead_after = {DEAD_AFTER}\n\n"
    "[reconnect]\nbase = 1.0\nmax = 60.0\njitter = 0.2\n",
)


async def test_idle_agent_notices_a_killed_broker_and_the_restarted_broker_reaches_it(
    tmp_path: Path,
) -> None:
    broker = await BrokerProcess(tmp_path / "broker").start()
    alice = AgentProcess(tmp_path / "a", "alice", "127.0.0.2", broker, timers=DEPLOYED)
    bob = AgentProcess(tmp_path / "b", "bob", "127.0.0.4", broker, timers=DEPLOYED)
    tail: TailCollector | None = None
    try:
        await alice.start()
        await bob.start()
        await alice.wait_connected()
        await bob.wait_connected()
        await alice.subscribe("feed.*")
        tail = TailCollector(alice.socket).start()
        assert (await bob.publish("feed.x", "before", n=0))["state"] == "published"
        await tail.wait_for(lambda records: len(records) == 1)

        killed = time.monotonic()
        await broker.kill9()

        async def disconnected() -> bool:
            return bool((await alice.status())["status"] == "DISCONNECTED")

        await eventually(disconnected)
        noticed = time.monotonic() - killed
        assert noticed <= BOUND + SLACK, f"DISCONNECTED after {noticed:.2f} s"
        status, sessions = await asyncio.gather(alice.cli("status"), broker.admin("sessions"))
        code, out, _err = status
        assert code == 1 and "DISCONNECTED" in out, out
        # The store still says CONNECTED; the command says no broker stands behind it.
        code, out, err = sessions
        assert code == 0 and "CONNECTED" in out and "no broker answers" in err, out + err

        async def bob_disconnected() -> bool:
            return bool((await bob.status())["status"] == "DISCONNECTED")

        await eventually(bob_disconnected)
        await broker.start()  # same ports, same database
        ready = time.monotonic()
        await bob.publish("feed.x", "after", n=1)
        await tail.wait_for(lambda records: len(records) == 2)
        took = time.monotonic() - ready
        assert tail.texts == ["before", "after"]
        assert took < 1.0, f"delivered {took:.2f} s after the broker was ready"
        assert (await alice.status())["status"] == "CONNECTED"
        # Alice's agent logged the outage it saw, which the churn jobs count.
        assert [r["event"] for r in alice.churn()].count("broker_lost") == 1
        code, out, err = await broker.admin("sessions")
        assert (code, err) == (0, ""), err
    finally:
        if tail is not None:
            await tail.close()
        # kill -9: a clean stop would wait for SIP transactions this test does not check.
        for agent in (alice, bob):
            if agent.running:
                await agent.kill9()
        await broker.stop()
