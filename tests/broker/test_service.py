"""BrokerService on loopback: two real RUDP endpoints, one of them playing the agent."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import sys
import types
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import func, select

from mdeci.broker import BrokerService, SessionKeyError
from mdeci.broker.core import PRUNE_CHUNK
from mdeci.broker.glue import Broker
from mdeci.broker.links import RudpDataPeer
from mdeci.config import QueueConfig, SubscriptionConfig
from mdeci.frames import (
    Ack,
    Error,
    Frame,
    List,
    Notify,
    Pub,
    PubOk,
    Sub,
    SubOk,
    Subs,
    decode,
    encode,
)
from mdeci.store.errors import StoreError
from mdeci.store.models import PublishedRow
from mdeci.store.queues import PublishRequest
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from rudp.aio import RudpEndpoint, RudpPeer
from rudp.config import RudpConfig
from tests.broker.conftest import FakeClock, WaitingSink, add_session, make_broker

ALICE = "sip:alice@example.com"
FEED = "sip:feed@example.com"
HOST = "127.0.0.1"
GUARD = 10.0  # seconds; a timeout only guards against a hang, it synchronises nothing

# Fails a peer after 0.05 + 0.1 + 0.1 + 0.1 s without an ACK: quick tests.
FAST = RudpConfig(rto_initial=0.05, rto_min=0.02, rto_max=0.1, max_retries=3, ack_delay=0.005)
FAILURE_TIME = FAST.rto_max * (FAST.max_retries + 1)


class Agent:
    """The device side, reduced to what the broker sees: RUDP frames in and out."""

    def __init__(self, endpoint: RudpEndpoint, peer: RudpPeer, key: bytes) -> None:
        self.endpoint = endpoint
        self.peer = peer
        self.key = key
        self.frames: asyncio.Queue[Frame] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, broker_addr: tuple[str, int], key: bytes | None = None) -> Agent:
        key = key if key is not None else secrets.token_bytes(32)
        endpoint = await RudpEndpoint.open(HOST, 0, config=FAST)
        return cls(endpoint, endpoint.peer(key, broker_addr), key)

    @property
    def addr(self) -> tuple[str, int]:
        return self.endpoint.local_addr

    async def _read(self) -> None:
        while True:
            self.frames.put_nowait(decode(await self.peer.receive()))

    async def next(self) -> Frame:
        return await asyncio.wait_for(self.frames.get(), GUARD)

    async def next_notify(self) -> Notify:
        frame = await self.next()
        assert isinstance(frame, Notify), frame
        return frame

    async def send(self, frame: Frame) -> None:
        await asyncio.wait_for(self.peer.send(encode(frame)), GUARD)

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.endpoint.close()


@pytest.fixture
async def service(
    store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> AsyncIterator[BrokerService]:
    broker = make_broker(store, clock, sink, queue=QueueConfig(window=4))
    svc = await BrokerService.open(broker, HOST, 0, FAST)
    svc.start()
    try:
        yield svc
    finally:
        await svc.close()


async def publish(service: BrokerService, *msg_ids: str) -> None:
    for msg_id in msg_ids:
        pub = Pub(req=1, msg_id=msg_id, subject="news.rio")
        [reply] = await service.worker.run(service.broker.handle, FEED, pub)
        assert isinstance(reply, PubOk), reply


async def test_frames_over_rudp_are_answered(service: BrokerService, store: BrokerStore) -> None:
    add_session(store, ALICE)
    agent = await Agent.open(service.local_addr)
    try:
        service.connected(ALICE, agent.addr, agent.key)
        await agent.send(Sub(req=1, subject="news.#"))
        sub_ok = await agent.next()
        assert isinstance(sub_ok, SubOk) and sub_ok.req == 1
        await agent.send(Sub(req=2, subject="x", filter="a =="))
        error = await agent.next()
        assert isinstance(error, Error) and (error.req, error.code) == (2, 400)
        await agent.send(Pub(req=3, msg_id="own", subject="news.rio"))
        # The pub-ok and the notify of the agent's own publish, in either order.
        got = {type(f): f for f in (await agent.next(), await agent.next())}
        pub_ok, notify = got[PubOk], got[Notify]
        assert isinstance(pub_ok, PubOk) and pub_ok.matched == 1
        assert isinstance(notify, Notify) and (notify.nseq, notify.sub_id) == (1, sub_ok.sub_id)
    finally:
        await agent.close()


async def test_delivery_in_order_exactly_once_through_the_window(
    service: BrokerService, store: BrokerStore, sink: WaitingSink
) -> None:
    broker = service.broker
    add_session(store, ALICE)
    await service.worker.run(broker.handle, ALICE, Sub(req=1, subject="news.*"))
    await publish(service, *(f"m{n}" for n in range(1, 11)))  # queued before the session
    agent = await Agent.open(service.local_addr)
    try:
        service.connected(ALICE, agent.addr, agent.key)
        seen: list[int] = []
        while len(seen) < 25:
            notify = await agent.next_notify()
            seen.append(notify.nseq)
            # Never more than the window (4) un-acked.
            assert len(await service.worker.run(broker.in_flight, ALICE)) <= 4
            if len(seen) == 3:
                await publish(service, *(f"m{n}" for n in range(11, 26)))  # pushed while running
            if len(seen) % 2 == 0 or len(seen) == 25:
                await agent.send(Ack(upto=notify.nseq))
        assert seen == list(range(1, 26))
        await sink.wait_for("notify_delivered", ALICE, count=25)
        assert await service.worker.run(broker.in_flight, ALICE) == ()
        # Nothing is sent twice: the next notify the agent sees is a new one.
        await publish(service, "m26")
        assert (await agent.next_notify()).nseq == 26
        assert agent.frames.empty()
        # The delivery task applied the held ack (upto 25) before it sent nseq 26.
        assert [n.nseq for n in store.queues.pending(ALICE)] == [26]
    finally:
        await agent.close()


async def test_unreachable_agent_is_disconnected_and_flushed_in_order_on_return(
    service: BrokerService, store: BrokerStore, sink: WaitingSink
) -> None:
    broker = service.broker
    loop = asyncio.get_running_loop()
    add_session(store, ALICE)
    await service.worker.run(broker.handle, ALICE, Sub(req=1, subject="news.rio"))
    agent = await Agent.open(service.local_addr)
    service.connected(ALICE, agent.addr, agent.key)
    await publish(service, "m1", "m2", "m3")
    assert [(await agent.next_notify()).nseq for _ in range(3)] == [1, 2, 3]
    await agent.send(Ack(upto=1))
    await sink.wait_for("notify_delivered", ALICE)
    await agent.close()  # the device leaves: nothing answers at its address any more

    started = loop.time()
    await publish(service, "m4")  # sent, never acknowledged
    gone = await asyncio.wait_for(sink.wait_for("media_disconnected", ALICE), GUARD)
    assert loop.time() - started <= FAILURE_TIME + 1.0
    assert "rudp" in str(gone.fields["reason"])
    assert not service.is_connected(ALICE)
    session = store.sessions.get_session(ALICE)
    assert session is not None and session.status is SessionStatus.DISCONNECTED

    await publish(service, "m5", "m6")  # queued while DISCONNECTED
    assert [n.nseq for n in store.queues.pending(ALICE)] == [2, 3, 4, 5, 6]

    # The device is back on a new port (a new RUDP association: new key in the re-INVITE).
    back = await Agent.open(service.local_addr)
    back_addr = back.addr
    try:
        service.connected(ALICE, back_addr, back.key)
        await service.settled()
        session = store.sessions.get_session(ALICE)
        assert session is not None and session.status is SessionStatus.CONNECTED
        seen = [(await back.next_notify()).nseq for _ in range(4)]
        assert seen == [2, 3, 4, 5]  # window 4, from the lowest un-acked
        await back.send(Ack(upto=5))
        assert (await back.next_notify()).nseq == 6
        await back.send(Ack(upto=6))
        await sink.wait_for("notify_delivered", ALICE, count=6)
        await publish(service, "m7")
        assert (await back.next_notify()).nseq == 7  # and nothing re-sent before it
        assert back.frames.empty()
        assert [n.nseq for n in store.queues.pending(ALICE)] == [7]  # acks applied
    finally:
        await back.close()
    connected = sink.named("media_connected")
    assert len(connected) == 2 and connected[1].fields["addr"] == f"{HOST}:{back_addr[1]}"


async def test_reinvite_with_the_same_key_from_a_new_address_sends_nothing_twice(
    service: BrokerService, store: BrokerStore, sink: WaitingSink
) -> None:
    """A move (same key, still CONNECTED) keeps the stream where it is: RUDP carries what
    was in flight to the new address, and the broker does not send its window again
    (it did, on every move, and a device moving often got mostly copies)."""
    broker = service.broker
    add_session(store, ALICE)
    await service.worker.run(broker.handle, ALICE, Sub(req=1, subject="news.rio"))
    agent = await Agent.open(service.local_addr)
    try:
        service.connected(ALICE, agent.addr, agent.key)
        await publish(service, "m1", "m2")
        assert [(await agent.next_notify()).nseq for _ in range(2)] == [1, 2]
        await agent.send(Ack(upto=1))
        await sink.wait_for("notify_delivered", ALICE)
        old_addr = agent.addr
        await agent.endpoint.rebind(HOST, 0)  # the device moved; its RUDP state stays
        service.connected(ALICE, agent.addr, agent.key)  # the re-INVITE
        moved = await sink.wait_for("media_connected", ALICE, count=2)
        assert moved.fields["prev_addr"] == f"{old_addr[0]}:{old_addr[1]}"
        assert moved.fields["addr"] == f"{agent.addr[0]}:{agent.addr[1]}"
        # Delivery keeps the session's own address, not a text of it per session; the
        # link reads its user and key from its session and peer, and keeps what is rarely
        # set only once set (six slots, not nine).
        link = service._users[ALICE]
        assert broker.core._links[ALICE].addr is link.session.media_addr
        assert (link.uri, link.key) == (ALICE, agent.key) and sys.getsizeof(link) <= 80
        assert link.sparse is None and (link.listing_bytes, link.refusing) == (16384, False)
        await publish(service, "m3")
        # Not nseq 2 again: the next notify is the new one.
        assert (await agent.next_notify()).nseq == 3
        await agent.send(Ack(upto=3))
        await sink.wait_for("notify_delivered", ALICE, count=3)
        assert agent.frames.empty()
        [(_, peer)] = service.peers()
        assert peer.stats.messages_sent == 3
        await service.settled()  # the held ack is applied after its event
        assert store.queues.depth(ALICE) == 0
        assert service.is_connected(ALICE)
    finally:
        await agent.close()


async def test_reinvite_after_a_delivery_failure_resends_unacked(
    service: BrokerService, store: BrokerStore, sink: WaitingSink
) -> None:
    """Not a move but a comeback: RUDP gave up on the user (DISCONNECTED), so the same
    key's re-INVITE restarts the stream from the lowest un-acked nseq."""
    broker = service.broker
    add_session(store, ALICE)
    await service.worker.run(broker.handle, ALICE, Sub(req=1, subject="news.rio"))
    agent = await Agent.open(service.local_addr)
    try:
        service.connected(ALICE, agent.addr, agent.key)
        agent.endpoint.drop_incoming = True  # the device stops hearing us
        await publish(service, "m1")
        await asyncio.wait_for(sink.wait_for("media_disconnected", ALICE), GUARD)
        agent.endpoint.drop_incoming = False
        service.connected(ALICE, agent.addr, agent.key)  # the re-INVITE
        assert (await agent.next_notify()).nseq == 1
        await agent.send(Ack(upto=1))
        await sink.wait_for("notify_delivered", ALICE)
        await service.settled()  # the held ack is applied after its event
        assert store.queues.depth(ALICE) == 0
    finally:
        await agent.close()


async def test_bye_stops_delivery_and_keeps_the_queue(
    service: BrokerService, store: BrokerStore
) -> None:
    broker = service.broker
    add_session(store, ALICE)
    await service.worker.run(broker.handle, ALICE, Sub(req=1, subject="news.rio"))
    agent = await Agent.open(service.local_addr)
    try:
        service.connected(ALICE, agent.addr, agent.key)
        service.disconnected(ALICE, ended=True)
        await service.settled()
        session = store.sessions.get_session(ALICE)
        assert session is not None and session.status is SessionStatus.ENDED
        await publish(service, "m1")
        assert not service.is_connected(ALICE)
        assert [n.nseq for n in store.queues.pending(ALICE)] == [1]
        with pytest.raises(SessionKeyError):
            service.connected(ALICE, agent.addr, b"short")
    finally:
        await agent.close()


async def _delivery_done(service: BrokerService) -> None:
    """Wait for the delivery task (one for every user) to end: it does once nothing is due."""
    running = service._delivery
    while running is not None:
        await asyncio.wait_for(asyncio.shield(running), GUARD)
        running = service._delivery
    assert not service._due


async def test_idle_sessions_hold_no_task_and_a_publish_wakes_one(
    service: BrokerService, store: BrokerStore
) -> None:
    """A broker holds thousands of idle sessions; none keeps a reader or a
    delivery task. A publish starts the one delivery task, which ends once sent."""
    broker = service.broker
    users = [f"sip:u{i}@example.com" for i in range(20)]
    agents: list[Agent] = []
    try:
        for i, uri in enumerate(users):
            add_session(store, uri)
            await service.worker.run(broker.handle, uri, Sub(req=1, subject=f"news.u{i}"))
            agent = await Agent.open(service.local_addr)
            agents.append(agent)
            service.connected(uri, agent.addr, agent.key)
        # The connects take a first (empty) batch; then nothing runs for any user.
        links = [service._users[uri] for uri in users]
        await _delivery_done(service)
        assert all(not link.sends for link in links)
        await publish(service, "m1")  # subject news.rio: nobody; news.u3 for users[3]
        [reply] = await service.worker.run(
            broker.handle, FEED, Pub(req=2, msg_id="m2", subject="news.u3")
        )
        assert isinstance(reply, PubOk) and reply.matched == 1
        notify = await agents[3].next_notify()
        assert notify.nseq == 1
        await agents[3].send(Ack(upto=1))
        # The frame arrived through the peer's report hook: no reader task, and the inbox
        # queue of the broker's peer was never built.
        peer = links[3].peer
        assert isinstance(peer, RudpDataPeer) and peer._inbox is None
        # Nor does it hold a callback object per session: its report hooks call the link.
        callbacks = (peer.on_message, peer.on_heard, peer.on_path_changed, peer.on_failed)
        assert callbacks == (None, None, None, None)
        await _delivery_done(service)
    finally:
        for agent in agents:
            await agent.close()


async def test_periodic_sweep_expires_subscriptions(
    store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    broker = make_broker(store, clock, sink, subscriptions=SubscriptionConfig(sweep_interval=0.01))
    [ok] = broker.handle(ALICE, Sub(req=1, subject="news.rio", ttl=5))
    assert isinstance(ok, SubOk)
    service = await BrokerService.open(broker, HOST, 0, FAST)
    try:
        service.start()
        clock.advance(5)
        expired = await asyncio.wait_for(sink.wait_for("subscription_expired", ALICE), GUARD)
        assert expired.fields["reason"] == f"sub_id={ok.sub_id} subject=news.rio"
        assert store.subscriptions.active_subscriptions(0.0) == []
        assert len(broker.matcher) == 0
    finally:
        await service.close()


async def test_periodic_sweep_prunes_old_msg_ids_in_chunks_and_logs_a_failure(
    store: BrokerStore, clock: FakeClock, sink: WaitingSink, caplog: pytest.LogCaptureFixture
) -> None:
    """After each sweep the service forgets the msg_ids older than the horizon, chunk
    after chunk until one comes back short (more than one chunk's worth here); a store
    that fails is logged (database_error, where=sweep), not swallowed, and the service
    goes on sweeping."""
    caplog.set_level(logging.ERROR, logger="mdeci")
    broker = make_broker(
        store, clock, sink, queue=QueueConfig(dedup_horizon=3600.0),
        subscriptions=SubscriptionConfig(sweep_interval=0.01),
    )  # fmt: skip
    many = PRUNE_CHUNK + PRUNE_CHUNK // 2
    store.queues.publish_many(
        [PublishRequest(FEED, f"m{n}", "news.rio", b"\xa0", b"", False, clock(), ())
         for n in range(many)],
        max_depth=10, policy="drop-oldest",
    )  # fmt: skip
    clock.advance(7200)
    failing = 0

    def prune_once_failing(now: float | None = None) -> int:
        nonlocal failing
        failing += 1
        if failing == 1:
            raise StoreError("prune_published failed: the disk is full")
        return Broker.prune(broker, now)

    broker.prune = prune_once_failing  # type: ignore[method-assign]
    service = await BrokerService.open(broker, HOST, 0, FAST)
    try:
        service.start()

        def remembered() -> int:
            counted = select(func.count()).select_from(PublishedRow)
            with store.engine.connect() as conn:
                return int(conn.execute(counted).scalar_one())

        async def forgotten() -> None:
            # The sweep runs on a timer: there is no event to await, only its effect.
            while remembered() or failing < 3:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(forgotten(), GUARD)
        assert failing >= 3  # the failure, then two chunks: a full one and a short one
        errors = [
            getattr(r, "mdeci_fields", {}) for r in caplog.records
            if r.getMessage() == "database_error"
        ]  # fmt: skip
        assert {"where": "sweep", "error": "prune_published failed: the disk is full"} in errors
    finally:
        await service.close()


async def test_a_peer_heard_again_by_keepalives_alone_is_served(
    service: BrokerService, store: BrokerStore, sink: WaitingSink
) -> None:
    """The broker gave up on a device that stopped hearing it; the device, whose own
    keepalives were still acknowledged, sends no frame and no re-INVITE. Its keepalive
    PINGs alone must bring delivery back (the stall seen under rapid handovers)."""
    broker = service.broker
    add_session(store, ALICE)
    await service.worker.run(broker.handle, ALICE, Sub(req=1, subject="news.rio"))
    chatty = dataclasses.replace(FAST, keepalive_interval=0.05, max_retries=200)
    endpoint = await RudpEndpoint.open(HOST, 0, config=chatty)
    key = secrets.token_bytes(32)
    agent = Agent(endpoint, endpoint.peer(key, service.local_addr), key)
    try:
        service.connected(ALICE, agent.addr, key)
        await publish(service, "m1")
        assert (await agent.next_notify()).nseq == 1
        await agent.send(Ack(upto=1))
        endpoint.drop_incoming = True  # the device hears nothing: the broker gives up
        await publish(service, "m2")
        await asyncio.wait_for(sink.wait_for("media_disconnected", ALICE), GUARD)
        endpoint.drop_incoming = False  # it hears again, and sends only keepalives
        assert (await agent.next_notify()).nseq == 2
        assert service.is_connected(ALICE)
    finally:
        await agent.close()


async def test_a_user_that_does_not_acknowledge_cannot_grow_the_broker(
    store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    """Held replies are bounded per user (60 subscriptions and 80 `list` requests left
    unacknowledged hold 34 MB without a bound). Past ``max_unacked_reply_bytes`` of held
    replies the user's requests are answered `error` 503 instead of being handled."""
    cap = 1 << 16
    broker = make_broker(store, clock, sink, queue=QueueConfig(max_unacked_reply_bytes=cap))
    # Patient enough that the broker does not give up while the agent is deaf.
    patient = RudpConfig(rto_initial=0.2, rto_min=0.1, rto_max=0.5, max_retries=12)
    service = await BrokerService.open(broker, HOST, 0, patient)
    add_session(store, ALICE)
    for n in range(60):
        sub = Sub(req=n, subject=f"news.region-{n:03d}.{'x' * 60}")
        [ok] = await service.worker.run(broker.handle, ALICE, sub)
        assert isinstance(ok, SubOk)
    # A window wide enough for the 80 requests to leave while nothing comes back.
    key = secrets.token_bytes(32)
    endpoint = await RudpEndpoint.open(HOST, 0, config=dataclasses.replace(patient, window=256))
    agent = Agent(endpoint, endpoint.peer(key, service.local_addr), key)
    try:
        service.connected(ALICE, agent.addr, agent.key)
        await agent.send(List(req=1))
        listing = await agent.next()
        assert isinstance(listing, Subs) and len(listing.items) == 60
        size = len(encode(listing))
        agent.endpoint.drop_incoming = True  # deaf: acknowledges nothing from now on
        sends = [asyncio.create_task(agent.peer.send(encode(List(req=100 + i)))) for i in range(80)]
        [(_, peer)] = service.peers()

        async def all_handled() -> None:
            # No event marks "handled"; the broker's reply count is the state to watch.
            while peer.stats.messages_sent < 1 + 80:
                await asyncio.sleep(0.005)

        await asyncio.wait_for(all_handled(), GUARD)
        assert service.refused_requests > 0
        agent.endpoint.drop_incoming = False  # the broker's retransmissions now arrive
        answers = [await agent.next() for _ in range(80)]
        listings = [a for a in answers if isinstance(a, Subs)]
        refusals = [a for a in answers if isinstance(a, Error)]
        assert len(listings) + len(refusals) == 80
        assert {(e.code, e.req is not None) for e in refusals} == {(503, True)}
        # Held replies never exceeded the cap by more than one listing.
        assert len(listings) * size <= cap + size
        assert len(refusals) == service.refused_requests >= 80 - (cap // size + 1)
        # Acknowledged again: requests are handled again.
        await agent.send(List(req=999))
        again = await agent.next()
        assert isinstance(again, Subs) and again.req == 999
        for task in sends:
            task.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
    finally:
        await agent.close()
        await service.close()


async def test_behind_a_relay_the_sdp_address_is_announced_and_moves_follow_the_source(
    service: BrokerService, store: BrokerStore, sink: WaitingSink
) -> None:
    """``[media] advertise``: the SDP answer carries the relay's address, and a
    move's SDP address (here one that reaches nobody, like a private address behind NAT)
    does not redirect a connected agent: its packets from the new address do, through
    RUDP path validation, and delivery goes on there."""
    service.advertise = ("192.0.2.7", 40000)
    assert service.local_addr == ("192.0.2.7", 40000)
    broker = service.broker
    add_session(store, ALICE)
    await service.worker.run(broker.handle, ALICE, Sub(req=1, subject="news.rio"))
    agent = await Agent.open(service.endpoint.local_addr)
    try:
        service.connected(ALICE, agent.addr, agent.key)  # first contact: the SDP address
        await publish(service, "m1")
        assert (await agent.next_notify()).nseq == 1
        await agent.send(Ack(upto=1))
        await sink.wait_for("notify_delivered", ALICE)
        await agent.endpoint.rebind(HOST, 0)  # moved; its first packets come from there
        service.connected(ALICE, (HOST, 9), agent.key)  # the re-INVITE's unusable address
        [(_, peer)] = service.peers()
        assert peer.addr != (HOST, 9)  # not followed
        await publish(service, "m2")
        assert (await agent.next_notify()).nseq == 2
        assert peer.addr == agent.addr
        assert peer.path_changes >= 1
    finally:
        await agent.close()


async def test_an_sms_side_makes_the_core_read_every_queue_it_serves(
    service: BrokerService,
) -> None:
    """The SMS side removes the rows it delivered, behind the core's back: the core then
    no longer hands a publish's rows on from memory (the rows ahead)."""
    assert service.broker.core._remember_rows
    side = types.SimpleNamespace(bind=lambda ip: None)  # binding only
    service.attach_sms(side)  # type: ignore[arg-type]
    await service.settled()
    assert not service.broker.core._remember_rows
