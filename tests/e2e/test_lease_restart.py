"""A subscription lease across a broker restart, with real processes.

The broker's ``default_ttl`` is a few seconds. Alice subscribes (a lease, the default);
the broker is killed (``kill -9``) and started again on the same ports and database
while her lease still has most of its lifetime. Her agent renews it on the restarted
broker (the same ``sub_id``: nothing lapsed, nothing ended) and goes on renewing it for
several TTLs, after which a notification bob publishes still matches and reaches her.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mdeci.agent.errors import ApiError
from tests.e2e.harness_b import AgentProcess, BrokerProcess, TailCollector, eventually

TTL = 6.0  # the broker's default TTL: the agent renews every 4 s; a restart takes less


async def _subs(agent: AgentProcess) -> list[dict[str, Any]]:
    """Alice's subscriptions as ``mdeci subs --all`` reads them (the broker's list)."""
    answer = await agent.call({"op": "subs"})
    items: list[dict[str, Any]] = answer["items"]
    return items


async def test_a_lease_lives_on_over_a_broker_restart_and_several_ttls(tmp_path: Path) -> None:
    broker = await BrokerProcess(
        tmp_path / "broker", extra=f"[subscriptions]\ndefault_ttl = {TTL}\n"
    ).start()
    alice = AgentProcess(tmp_path / "a", "alice", "127.0.0.2", broker)
    bob = AgentProcess(tmp_path / "b", "bob", "127.0.0.4", broker)
    tail: TailCollector | None = None
    try:
        await alice.start()
        await bob.start()
        await alice.wait_connected()
        await bob.wait_connected()
        sub_id = await alice.subscribe("feed.*")  # no ttl: the broker's default
        (sub,) = await _subs(alice)
        first = float(sub["expires_at"])
        assert (sub["sub_id"], sub["lease"], sub["state"]) == (sub_id, True, "live")

        await broker.kill9()
        await broker.start()  # same ports, same database

        async def renewed_past_several_ttls() -> bool:
            try:  # the list is the broker's: it fails until alice has found it again
                items = await _subs(alice)
            except ApiError:
                return False
            assert [(s["sub_id"], s["state"]) for s in items] == [(sub_id, "live")], items
            return float(items[0]["expires_at"]) >= first + 3 * TTL

        await eventually(renewed_past_several_ttls)
        tail = TailCollector(alice.socket).start()
        published = await bob.publish("feed.x", "after the restart")
        assert (published["state"], published["matched"]) == ("published", 1), published
        await tail.wait_for(lambda records: len(records) == 1)
        assert tail.records[0]["sub_id"] == sub_id and tail.texts == ["after the restart"]
    finally:
        if tail is not None:
            await tail.close()
        for agent in (alice, bob):
            if agent.running:
                await agent.kill9()
        await broker.stop()
