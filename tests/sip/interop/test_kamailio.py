"""Interop with Kamailio (configs/kamailio.cfg): two of our UAs register there and one
calls the other through it (location lookup, Record-Route), then re-INVITE and BYE."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sip.aio.ua import (
    DialogEnded,
    DialogRefreshed,
    DialogStarted,
    IncomingRequest,
    Reply,
    UaConfig,
    UserAgent,
)
from sip.transaction import TimerConfig
from tests.sip.interop.kamailio import Kamailio

pytestmark = pytest.mark.peer("kamailio")
FAST = TimerConfig(t1=0.1)


async def answer(req: IncomingRequest) -> Reply:
    return Reply(200, body=b"answer:" + req.request.body)


async def next_event(ua: UserAgent, kind: type) -> object:
    while True:
        event = await asyncio.wait_for(ua.events.get(), 10)
        if isinstance(event, kind):
            return event


async def test_call_through_kamailio(tmp_path: Path) -> None:
    kam = Kamailio(tmp_path)
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST))
    bob = UserAgent(UaConfig(aor="sip:bob@example.org", timers=FAST), answer)
    try:
        await kam.ready()
        await alice.start("127.0.0.2")
        await bob.start("127.0.0.3")
        assert (await alice.register(kam.addr, 600)).status == 200
        assert (await bob.register(kam.addr, 600)).status == 200

        dialog, response = await alice.invite("sip:bob@example.org", kam.addr, b"offer")
        assert response.status == 200 and response.body == b"answer:offer"
        # Kamailio stayed on the path: our route set names it, with lr.
        assert len(dialog.route_set) == 1 and str(kam.port) in dialog.route_set[0]
        started = await next_event(bob, DialogStarted)
        assert isinstance(started, DialogStarted)
        assert started.dialog.route_set == dialog.route_set

        # Alice moves and re-INVITEs through the proxy; bob learns the new target.
        await alice.move("127.0.0.4", 0, reinvite_body=lambda d: b"moved")
        refreshed = await next_event(bob, DialogRefreshed)
        assert isinstance(refreshed, DialogRefreshed) and refreshed.body == b"moved"
        assert "127.0.0.4" in started.dialog.remote_target

        # Bob hangs up; the BYE goes through Kamailio to alice's new address.
        assert (await bob.bye(started.dialog)).status == 200
        assert isinstance(await next_event(alice, DialogEnded), DialogEnded)
        assert (await alice.unregister()).status == 200
    finally:
        await alice.close()
        await bob.close()
        kam.stop()
