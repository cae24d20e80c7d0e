"""With SMS on, the broker still runs no database statement on its event loop.

Probe: the SMS side read the session and the queue, counted usage, read calendars and
deleted delivered rows on the event loop, so a hung PostgreSQL stalled every SIP and
RUDP exchange of an SMS-enabled broker for up to the statement timeout per call. Here
every statement the broker's engine executes records its thread, through a whole SMS
story: an IP outage, urgent notifications by SMS (usage counted, rows deleted on the
buffer acks), a normal one waiting, a calendar from the device, and IP coming back.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from mdeci.agent import Agent
from mdeci.frames import CalendarRule
from mdeci.sms.smsc import SmscConfig
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import (
    ALICE,
    Deaf,
    Sink,
    guard,
    ip_back,
    network,
    sms_config,
    sms_world,
    until,
)

URGENT = 4


def _sms_nseqs(sink: Sink, event: str) -> set[int]:
    return {
        int(e.fields["nseq"])  # type: ignore[arg-type]
        for e in sink.named(event)
        if e.uri == ALICE and e.fields.get("channel") == "sms"
    }


def _inbox(agent: Agent) -> set[int]:
    return {int(r["nseq"]) for r in agent.delivered_since(0)}


async def test_the_sms_side_runs_no_statement_on_the_event_loop(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: Sink
) -> None:
    loop_thread = threading.get_ident()
    seen: list[tuple[int, str]] = []

    def record(*args: Any) -> None:  # before_cursor_execute(conn, cursor, statement, ...)
        seen.append((threading.get_ident(), str(args[2]).split(None, 1)[0]))

    sa.event.listen(store.engine, "before_cursor_execute", record)
    net = network(SmscConfig(delays=SmscConfig().delays, time_scale=0.001), 1)
    try:
        async with sms_world(tmp_path, store, clock, sink, sms_config(ttl=600.0), net) as (
            broker,
            alice,
            bob,
        ):
            await guard(alice.subscribe("alerts.*"))
            await guard(alice.send_calendar([CalendarRule(channel="ip", p=1.0)]))
            deaf = Deaf(alice)
            deaf.on = True
            for i in range(URGENT):
                await guard(bob.publish("alerts.fire", {"i": i}, b"x" * 50, urgent=True))
            await guard(sink.wait_for("media_disconnected", ALICE))
            await guard(bob.publish("alerts.fire", {"i": URGENT}, b"normal", urgent=False))
            urgent = set(range(1, URGENT + 1))
            await guard(until(sink, lambda: _sms_nseqs(sink, "notify_delivered") >= urgent))
            assert _sms_nseqs(sink, "sms_sent") == urgent
            deaf.on = False
            await ip_back(alice)
            await guard(alice.wait_until(lambda: URGENT + 1 in _inbox(alice)))
            await broker.service.settled()
            assert broker.sms is not None
            await broker.sms.idle()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    on_loop = [statement for thread, statement in seen if thread == loop_thread]
    assert not on_loop, f"statements on the event loop: {on_loop}"
    # The story did reach the store from the SMS side (reads, usage, deletions).
    kinds = {statement.upper() for _, statement in seen}
    assert {"SELECT", "INSERT", "DELETE"} <= kinds, kinds
