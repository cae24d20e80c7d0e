"""A slow or hung PostgreSQL must not freeze SIP and RUDP handling.

Probe: another connection holds a lock on the queue table, so the broker's next publish
waits in PostgreSQL (until the store's statement timeout). While it waits, the broker
must keep answering SIP OPTIONS and acknowledging RUDP packets, and must not answer the
publish before the database did (no ``pub-ok`` before the commit): the store runs off
the event loop, so SIP and RUDP are answered while the statement waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from mdeci.broker.app import RunningBroker
from mdeci.frames import Ack, Error, Pub, PubOk, Sub, SubOk
from mdeci.store.base import PG_STATEMENT_TIMEOUT_MS
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock, WaitingSink
from tests.broker.test_service import GUARD
from tests.broker.test_sip_endpoint import Device, devices, open_device, start_broker

PROBES = 20  # OPTIONS round trips while the database is held
__all__ = ["devices"]  # the fixture, used by name


@pytest.fixture
async def pg_broker(
    tmp_path: Path, pg_store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> AsyncIterator[RunningBroker]:
    rb = await start_broker(tmp_path, pg_store, clock, sink)
    try:
        yield rb
    finally:
        await rb.close()


def _hold_queue_table(store: BrokerStore) -> Connection:
    """A transaction of another connection holding the queue table exclusively."""
    conn = store.engine.connect()
    conn.begin()
    # The store's connections end after 5 s idle in a transaction, as long as the
    # broker's statement waits for this lock: the holder would race the refusal it
    # provokes. It stays until the test closes it.
    conn.execute(sa.text("SET LOCAL idle_in_transaction_session_timeout = 0"))
    conn.execute(sa.text("LOCK TABLE queued_notifications IN ACCESS EXCLUSIVE MODE"))
    return conn


def _broker_waits_on_lock(store: BrokerStore, holder: Connection) -> bool:
    """True once some other backend of this database waits for the holder's lock."""
    with store.engine.connect() as conn:
        holder_pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        blocked = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
            ),
            {"pid": holder_pid},
        ).scalar_one()
    return int(blocked) > 0


async def _until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for a condition of another process (PostgreSQL has no event to await)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD
    while not await asyncio.to_thread(predicate):
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def _options(dev: Device, broker: RunningBroker) -> int:
    request = dev.ua.build_request(
        "OPTIONS", f"sip:broker@{broker.sip_addr[0]}", to="<sip:broker@x>"
    )
    response = await asyncio.wait_for(dev.ua.request(request, broker.sip_addr), GUARD)
    return response.status


async def test_a_hung_database_does_not_stop_sip_and_rudp(
    pg_broker: RunningBroker, pg_store: BrokerStore, devices: list[Device]
) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    await asyncio.wait_for(alice.ua.register(pg_broker.sip_addr, 600), GUARD)
    await alice.call(pg_broker)
    assert alice.agent is not None
    await alice.agent.send(Sub(req=1, subject="news.*"))
    assert isinstance(await alice.agent.next(), SubOk)

    holder = await asyncio.to_thread(_hold_queue_table, pg_store)
    try:
        await alice.agent.send(Pub(req=2, msg_id="m1", subject="news.rio"))
        await _until(lambda: _broker_waits_on_lock(pg_store, holder), "the publish waits")
        # The database thread is stuck in PostgreSQL; the loop is not.
        for _ in range(PROBES):
            assert await _options(alice, pg_broker) == 200
        # RUDP: a frame sent now is acknowledged by the broker's transport (its handling
        # queues behind the stuck publish).
        await alice.agent.send(Ack(upto=0))
        assert alice.agent.frames.empty(), "answered before the database did"
        assert await asyncio.to_thread(_broker_waits_on_lock, pg_store, holder)
        # The bound: the statement times out and the publish is refused, not lost silently.
        refused = await asyncio.wait_for(alice.agent.next(), GUARD + PG_STATEMENT_TIMEOUT_MS / 1000)
        assert isinstance(refused, Error) and (refused.req, refused.code) == (2, 503), refused
    finally:
        await asyncio.to_thread(holder.close)  # rolls back: the lock goes

    # The database is back: the retried publish is stored, acknowledged and delivered.
    await alice.agent.send(Pub(req=3, msg_id="m1", subject="news.rio"))
    got = {type(f): f for f in (await alice.agent.next(), await alice.agent.next())}
    ok = got.get(PubOk)
    assert isinstance(ok, PubOk) and (ok.req, ok.matched) == (3, 1), got
    assert [n.msg_id for n in pg_store.queues.pending("sip:alice@example.org")] == ["m1"]
