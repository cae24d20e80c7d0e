"""Frame handling of the broker core on a migrated store with a fake clock."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cbor2
import pytest
import sqlalchemy as sa

from mdeci.broker import Broker, BrokerCoreConfig, ChurnLogSink, MemorySink
from mdeci.churnlog import ChurnLog
from mdeci.config import QueueConfig, SubscriptionConfig
from mdeci.errors import ConfigError, FrameError
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
    Unsub,
    decode,
    encode,
)
from mdeci.store.errors import StoreError
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionStatus
from tests.broker.conftest import T0, FakeClock, WaitingSink, add_session, make_broker

ALICE = "sip:alice@example.com"
BOB = "sip:bob@example.com"
CAROL = "sip:carol@example.com"
PUBLISHER = "sip:feed@example.com"


def one(frames: list[Frame]) -> Frame:
    assert len(frames) == 1, frames
    return frames[0]


def subscribe(broker: Broker, uri: str, subject: str, filter: str = "", **kw: Any) -> SubOk:
    reply = one(broker.handle_frame(uri, encode(Sub(req=1, subject=subject, filter=filter, **kw))))
    assert isinstance(reply, SubOk), reply
    return reply


def publish(
    broker: Broker, msg_id: str, subject: str, uri: str = PUBLISHER, **attrs: str | int | float
) -> PubOk:
    frame = Pub(req=7, msg_id=msg_id, subject=subject, attrs=attrs, payload=b"p-" + msg_id.encode())
    reply = one(broker.handle_frame(uri, encode(frame)))
    assert isinstance(reply, PubOk), reply
    return reply


def queued(store: BrokerStore, uri: str) -> list[tuple[int, str, int]]:
    return [(n.nseq, n.msg_id, n.sub_id) for n in store.queues.pending(uri)]


def notifies(broker: Broker, uri: str) -> list[Notify]:
    out = []
    for item in broker.take_batch(uri):
        frame = decode(item.data)
        assert isinstance(frame, Notify) and frame.nseq == item.nseq
        out.append(frame)
    return out


# ---------------------------------------------------------------------------- sub


def test_sub_stores_and_answers_with_default_and_clamped_ttl(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(
        store, clock, sink, subscriptions=SubscriptionConfig(default_ttl=100.0, max_ttl=1000.0)
    )
    default = subscribe(broker, ALICE, "quotes.*.PETR4", "Price < 25")
    assert default.expires_at == T0 + 100.0
    clamped = subscribe(broker, ALICE, "quotes.#", ttl=5000)
    assert clamped.expires_at == T0 + 1000.0
    short = subscribe(broker, ALICE, "news", ttl=10)
    assert short.expires_at == T0 + 10.0
    stored = store.subscriptions.list_subscriptions(ALICE, T0)
    assert [(str(s.sub_id), s.subject, s.filter) for s in stored] == [
        (default.sub_id, "quotes.*.PETR4", "Price < 25"),
        (clamped.sub_id, "quotes.#", ""),
        (short.sub_id, "news", ""),
    ]
    assert len(broker.matcher) == 3
    assert [e.uri for e in sink.named("subscription_added")] == [ALICE] * 3


def test_bad_filter_is_refused_with_its_position_and_nothing_stored(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(store, clock, sink)
    reply = one(broker.handle_frame(ALICE, encode(Sub(req=3, subject="a.b", filter="x == "))))
    assert isinstance(reply, Error)
    assert (reply.req, reply.code) == (3, 400)
    assert "position 5" in reply.message
    reply = one(broker.handle_frame(ALICE, encode(Sub(req=4, subject="a", filter="(a == 1"))))
    assert isinstance(reply, Error) and "position 7" in reply.message
    assert store.subscriptions.list_subscriptions(ALICE, T0) == []
    assert len(broker.matcher) == 0
    assert sink.events == []


def test_bad_subject_pattern_is_refused(store: BrokerStore, clock: FakeClock) -> None:
    broker = make_broker(store, clock, MemorySink())
    data = cbor2.dumps({"op": "sub", "req": 9, "subject": "a.b*.c"})
    reply = one(broker.handle_frame(ALICE, data))
    assert isinstance(reply, Error) and (reply.req, reply.code) == (9, 400)
    assert store.subscriptions.list_subscriptions(ALICE, T0) == []


# ---------------------------------------------------------------------------- unsub, list


def test_unsub_removes_own_and_refuses_someone_elses(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(store, clock, sink)
    alices = subscribe(broker, ALICE, "a.#")
    bobs = subscribe(broker, BOB, "a.#")
    refused = one(broker.handle_frame(ALICE, encode(Unsub(req=5, sub_id=bobs.sub_id))))
    assert isinstance(refused, Error) and (refused.req, refused.code) == (5, 404)
    assert [s.sub_id for s in store.subscriptions.list_subscriptions(BOB, T0)] == [int(bobs.sub_id)]
    for unknown in ("999", "x", "0", "9" * 30):
        reply = one(broker.handle_frame(ALICE, encode(Unsub(req=6, sub_id=unknown))))
        assert isinstance(reply, Error) and reply.code == 404
    ok = one(broker.handle_frame(ALICE, encode(Unsub(req=7, sub_id=alices.sub_id))))
    assert isinstance(ok, SubOk) and (ok.req, ok.sub_id) == (7, alices.sub_id)
    assert store.subscriptions.list_subscriptions(ALICE, T0) == []
    assert publish(broker, "m1", "a.b").matched == 1  # Bob's only
    again = one(broker.handle_frame(ALICE, encode(Unsub(req=8, sub_id=alices.sub_id))))
    assert isinstance(again, Error) and again.code == 404
    assert [e.uri for e in sink.named("subscription_removed")] == [ALICE]


def test_list_shows_only_unexpired_own_subscriptions(store: BrokerStore, clock: FakeClock) -> None:
    broker = make_broker(store, clock, MemorySink())
    short = subscribe(broker, ALICE, "a", ttl=10)
    long = subscribe(broker, ALICE, "b.*", "exists(x)", ttl=100)
    subscribe(broker, BOB, "c")
    reply = one(broker.handle_frame(ALICE, encode(List(req=11))))
    assert isinstance(reply, Subs) and reply.req == 11
    assert [i.sub_id for i in reply.items] == [short.sub_id, long.sub_id]
    clock.advance(10)  # expires_at == now: expired
    reply = one(broker.handle_frame(ALICE, encode(List(req=12))))
    assert isinstance(reply, Subs)
    assert [(i.sub_id, i.subject, i.filter, i.expires_at) for i in reply.items] == [
        (long.sub_id, "b.*", "exists(x)", T0 + 100)
    ]


# ---------------------------------------------------------------------------- pub


def test_pub_is_queued_for_matching_subjects_and_filters(
    any_store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    store = any_store
    broker = make_broker(store, clock, sink)
    a_star = subscribe(broker, ALICE, "quotes.*.PETR4")
    a_cheap = subscribe(broker, ALICE, "quotes.#", "(Stock == 'PETR4') and (Price < 25)")
    b_hash = subscribe(broker, BOB, "#.PETR4")
    subscribe(broker, BOB, "quotes.nyse.*")
    subscribe(broker, CAROL, "quotes.*", "Price < 25")  # one word only: no match
    reply = publish(broker, "m1", "quotes.bovespa.PETR4", Stock="PETR4", Price=24.5)
    assert (reply.req, reply.msg_id, reply.matched) == (7, "m1", 3)
    reply = publish(broker, "m2", "quotes.bovespa.PETR4", Stock="PETR4", Price=30)
    assert reply.matched == 2
    assert queued(store, ALICE) == [
        (1, "m1", int(a_star.sub_id)),
        (2, "m1", int(a_cheap.sub_id)),
        (3, "m2", int(a_star.sub_id)),
    ]
    assert queued(store, BOB) == [(1, "m1", int(b_hash.sub_id)), (2, "m2", int(b_hash.sub_id))]
    assert queued(store, CAROL) == []
    events = [
        (e.uri, e.fields["nseq"], e.fields["queue_depth"]) for e in sink.named("notify_queued")
    ]
    assert events == [(ALICE, 1, 1), (ALICE, 2, 2), (BOB, 1, 1), (ALICE, 3, 3), (BOB, 2, 2)]
    assert publish(broker, "m3", "weather.rio").matched == 0


def test_duplicate_pub_answers_the_same_count_and_queues_nothing_more(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(store, clock, sink)
    subscribe(broker, ALICE, "a.*")
    subscribe(broker, BOB, "a.b")
    assert publish(broker, "dup", "a.b").matched == 2
    subscribe(broker, CAROL, "a.b")  # a re-send after this must not reach Carol either
    again = publish(broker, "dup", "a.b")
    assert again.matched == 2
    assert [q[0] for q in queued(store, ALICE)] == [1]
    assert [q[0] for q in queued(store, BOB)] == [1]
    assert queued(store, CAROL) == []
    assert len(sink.named("notify_queued")) == 2
    # The same msg_id from another publisher is another message.
    assert publish(broker, "dup", "a.b", uri=BOB).matched == 3


def test_ack_removes_queued_notifications(store: BrokerStore, clock: FakeClock) -> None:
    broker = make_broker(store, clock, MemorySink())
    subscribe(broker, ALICE, "a")
    for n in range(4):
        publish(broker, f"m{n}", "a")
    assert broker.handle_frame(ALICE, encode(Ack(upto=2))) == []
    broker.flush_acks(ALICE)
    assert [q[0] for q in queued(store, ALICE)] == [3, 4]
    assert broker.handle_frame(BOB, encode(Ack(upto=4))) == []  # Bob's ack is Bob's queue
    broker.flush_acks()
    assert [q[0] for q in queued(store, ALICE)] == [3, 4]


def test_acks_are_coalesced_into_one_store_delete_per_wake(
    store: BrokerStore, clock: FakeClock
) -> None:
    broker = make_broker(store, clock, MemorySink(), queue=QueueConfig(window=8))
    add_session(store, ALICE)
    subscribe(broker, ALICE, "a")
    for n in range(8):
        publish(broker, f"m{n}", "a")
    broker.mark_connected(ALICE)
    assert [n.nseq for n in notifies(broker, ALICE)] == list(range(1, 9))
    calls: list[tuple[str, int]] = []
    real_ack_many = store.queues.ack_many

    def counting_ack_many(acks: Sequence[tuple[str, int]]) -> list[int]:
        calls.extend(acks)
        return real_ack_many(acks)

    store.queues.ack_many = counting_ack_many  # type: ignore[method-assign]
    for upto in (1, 2, 4, 3, 5):  # one per notify, as agents do (one late, lower)
        broker.handle_frame(ALICE, encode(Ack(upto=upto)))
    assert calls == [] and broker.in_flight(ALICE) == (6, 7, 8)
    assert [q[0] for q in queued(store, ALICE)] == list(range(1, 9))  # held, not lost
    assert broker.take_batch(ALICE) == []  # the delivery wake applies the highest once
    assert calls == [(ALICE, 5)]
    assert [q[0] for q in queued(store, ALICE)] == [6, 7, 8]
    broker.handle_frame(ALICE, encode(Ack(upto=6)))
    broker.mark_disconnected(ALICE, "test")  # and so does a disconnection
    assert calls == [(ALICE, 5), (ALICE, 6)]
    assert [q[0] for q in queued(store, ALICE)] == [7, 8]


def test_held_ack_is_applied_before_a_publish_counts_overflow(
    store: BrokerStore, clock: FakeClock
) -> None:
    sink = MemorySink()
    broker = make_broker(store, clock, sink, queue=QueueConfig(max_per_uri=2))
    add_session(store, ALICE)
    subscribe(broker, ALICE, "a")
    publish(broker, "m0", "a")
    publish(broker, "m1", "a")
    broker.mark_connected(ALICE)
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2]
    broker.handle_frame(ALICE, encode(Ack(upto=2)))
    publish(broker, "m2", "a")
    publish(broker, "m3", "a")
    assert sink.named("notify_dropped") == []


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff",
        b"\xa1\x01",  # map with a truncated entry
        cbor2.dumps([1, 2]),
        cbor2.dumps({"op": "nope", "req": 1}),
        cbor2.dumps({"op": "pub", "req": 2, "msg_id": "m", "subject": "a.*"}),
        cbor2.dumps({"op": "sub", "req": 3, "subject": "a"}) + b"\x00",
        cbor2.dumps({"op": "ack", "upto": -1}),
        cbor2.dumps(cbor2.CBORTag(1, 0)),
        b"\x00" * ((1 << 20) + 1),
    ],
)
def test_malformed_bytes_give_an_error_frame_and_change_nothing(
    store: BrokerStore, clock: FakeClock, sink: MemorySink, data: bytes
) -> None:
    broker = make_broker(store, clock, sink)
    subscribe(broker, ALICE, "#")
    before = len(sink.events)
    reply = one(broker.handle_frame(ALICE, data))
    assert isinstance(reply, Error) and reply.code in (400, 413)
    assert len(sink.events) == before
    assert store.queues.pending(ALICE) == []
    assert len(store.subscriptions.list_subscriptions(ALICE, T0)) == 1


def test_frames_an_agent_must_not_send_are_refused_and_errors_ignored(
    store: BrokerStore, clock: FakeClock
) -> None:
    broker = make_broker(store, clock, MemorySink())
    reply = one(broker.handle_frame(ALICE, encode(PubOk(req=4, msg_id="m", matched=1))))
    assert isinstance(reply, Error) and (reply.req, reply.code) == (4, 400)
    assert broker.handle_frame(ALICE, encode(Error(req=1, code=500, message="x"))) == []


def test_publish_too_large_to_notify_is_refused(store: BrokerStore, clock: FakeClock) -> None:
    broker = make_broker(store, clock, MemorySink())
    subscribe(broker, ALICE, "a")
    big = Pub(req=1, msg_id="big", subject="a", payload=b"x" * ((1 << 20) - 100))
    reply = one(broker.handle(PUBLISHER, big))
    assert isinstance(reply, Error) and reply.code == 413
    assert store.queues.pending(ALICE) == []


# ---------------------------------------------------------------------------- TTL


def test_expired_subscription_is_removed_at_matching_time(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(store, clock, sink)
    short = subscribe(broker, ALICE, "a", ttl=10)
    subscribe(broker, BOB, "a", ttl=100)
    clock.advance(9.999)
    assert publish(broker, "m1", "a").matched == 2
    clock.advance(0.001)  # now == expires_at: expired
    assert publish(broker, "m2", "a").matched == 1
    assert int(short.sub_id) not in broker.matcher
    assert store.subscriptions.get_subscription(int(short.sub_id), 0.0) is None  # deleted
    expired = sink.named("subscription_expired")
    assert [e.uri for e in expired] == [ALICE]
    assert [q[1] for q in queued(store, ALICE)] == ["m1"]


def test_sweep_removes_expired_subscriptions(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(store, clock, sink)
    subscribe(broker, ALICE, "a", ttl=10)
    subscribe(broker, BOB, "b", ttl=20)
    assert broker.sweep() == []
    clock.advance(15)
    assert [s.uri for s in broker.sweep()] == [ALICE]
    assert len(broker.matcher) == 1
    assert [s.uri for s in broker.sweep(T0 + 20)] == [BOB]
    assert len(broker.matcher) == 0
    assert [e.uri for e in sink.named("subscription_expired")] == [ALICE, BOB]
    assert store.subscriptions.active_subscriptions(T0) == []


def test_prune_forgets_msg_ids_older_than_the_dedup_horizon(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    """The (publisher, msg_id) rows are pruned: within the horizon a re-send is a
    duplicate, past it a new publish (the table used to keep every msg_id for good)."""
    broker = make_broker(store, clock, sink, queue=QueueConfig(dedup_horizon=3600.0))
    subscribe(broker, ALICE, "a", ttl=10_000)
    publish(broker, "old", "a")
    clock.advance(2000)
    publish(broker, "young", "a")
    clock.advance(1700)  # "old" is 3,700 s old, "young" 1,700 s
    assert broker.prune() == 1
    assert publish(broker, "young", "a").matched == 1
    assert [q[1] for q in queued(store, ALICE)] == ["old", "young"]  # a duplicate
    publish(broker, "old", "a")
    assert [q[1] for q in queued(store, ALICE)] == ["old", "young", "old"]  # new again


def test_queued_notifications_of_an_expired_subscription_are_still_delivered(
    store: BrokerStore, clock: FakeClock
) -> None:
    broker = make_broker(store, clock, MemorySink())
    sub = subscribe(broker, ALICE, "a", ttl=10)
    publish(broker, "m1", "a", k=1)
    clock.advance(60)
    broker.sweep()
    assert publish(broker, "m2", "a").matched == 0
    add_session(store, ALICE)
    broker.mark_connected(ALICE, "127.0.0.1:4000")
    [notify] = notifies(broker, ALICE)
    assert (notify.nseq, notify.sub_id, notify.msg_id, notify.subject) == (1, sub.sub_id, "m1", "a")
    assert dict(notify.attrs) == {"k": 1} and notify.payload == b"p-m1"
    assert notify.published_at == T0


def test_matcher_is_loaded_from_the_store_at_start(store: BrokerStore, clock: FakeClock) -> None:
    first = make_broker(store, clock, MemorySink())
    subscribe(first, ALICE, "a.#", "n > 1")
    subscribe(first, BOB, "a", ttl=1)
    clock.advance(1)
    second = make_broker(store, clock, MemorySink())  # a broker restart
    assert len(second.matcher) == 1
    assert publish(second, "m", "a.b", n=2).matched == 1


# ---------------------------------------------------------------------------- delivery core


def test_take_batch_respects_order_window_and_acks(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(store, clock, sink, queue=QueueConfig(window=3))
    add_session(store, ALICE)
    subscribe(broker, ALICE, "a")
    for n in range(5):
        publish(broker, f"m{n}", "a")
    assert broker.take_batch(ALICE) == []  # not connected yet
    broker.mark_connected(ALICE, "127.0.0.1:4000")
    session = store.sessions.get_session(ALICE)
    assert session is not None and session.status is SessionStatus.CONNECTED
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2, 3]
    assert broker.take_batch(ALICE) == []  # window full
    assert broker.in_flight(ALICE) == (1, 2, 3)
    clock.advance(0.25)
    broker.handle_frame(ALICE, encode(Ack(upto=2)))
    delivered = sink.named("notify_delivered")
    assert [(e.fields["nseq"], e.fields["latency_ms"]) for e in delivered] == [
        (1, 250.0),
        (2, 250.0),
    ]
    assert [n.nseq for n in notifies(broker, ALICE)] == [4, 5]
    assert broker.take_batch(ALICE) == []
    # A reconnection starts again from the lowest un-acked nseq.
    broker.mark_disconnected(ALICE, "test")
    session = store.sessions.get_session(ALICE)
    assert session is not None and session.status is SessionStatus.DISCONNECTED
    assert broker.take_batch(ALICE) == []
    broker.mark_connected(ALICE, "127.0.0.1:4001")
    assert [n.nseq for n in notifies(broker, ALICE)] == [3, 4, 5]
    connected = sink.named("media_connected")[-1]
    assert (connected.fields["addr"], connected.fields["prev_addr"]) == (
        "127.0.0.1:4001",
        "127.0.0.1:4000",
    )
    assert [e.fields["reason"] for e in sink.named("media_disconnected")] == ["test"]


def test_ack_after_a_reconnection_logs_what_an_earlier_connection_sent(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    """A handover: the agent's ack of nseqs sent before a re-INVITE (or a RUDP failure)
    arrives after ``mark_connected``, before they are taken again. They are acked in the
    store, so never taken again; each must still be logged ``notify_delivered`` once
    (the 100-move handover test waited forever for the missing ones)."""
    broker = make_broker(store, clock, sink, queue=QueueConfig(window=4))
    add_session(store, ALICE)
    subscribe(broker, ALICE, "a")
    for n in range(6):
        publish(broker, f"m{n}", "a")
    broker.mark_connected(ALICE, "127.0.0.2:4000")
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2, 3, 4]
    broker.mark_connected(ALICE, "127.0.0.3:4000")  # the re-INVITE after a move
    clock.advance(0.5)
    broker.handle_frame(ALICE, encode(Ack(upto=2)))  # sent at 127.0.0.2, acked now
    assert [n.nseq for n in notifies(broker, ALICE)] == [3, 4, 5, 6]
    broker.mark_disconnected(ALICE, "rudp: no ACK after retries")
    broker.handle_frame(ALICE, encode(Ack(upto=4)))  # it got them before failing
    broker.mark_connected(ALICE, "127.0.0.4:4000")
    assert [n.nseq for n in notifies(broker, ALICE)] == [5, 6]
    broker.handle_frame(ALICE, encode(Ack(upto=6)))
    delivered = [(e.fields["nseq"], e.fields["latency_ms"]) for e in sink.named("notify_delivered")]
    assert delivered == [(1, 500.0), (2, 500.0), (3, 500.0), (4, 500.0), (5, 500.0), (6, 500.0)]
    assert store.queues.depth(ALICE) == 0


def test_an_ack_over_ip_of_what_sms_delivered_is_not_a_second_delivery(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    """An urgent notification in RUDP flight when IP was cut went by SMS (and was logged
    delivered there); the agent's later IP ack covering it logged it delivered again."""
    broker = make_broker(store, clock, sink, queue=QueueConfig(window=4))
    add_session(store, ALICE)
    subscribe(broker, ALICE, "a")
    for n in range(3):
        publish(broker, f"m{n}", "a")
    broker.mark_connected(ALICE, "127.0.0.2:4000")
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2, 3]
    broker.mark_disconnected(ALICE, "rudp: no ACK after retries")
    broker.delivered_elsewhere(ALICE, 2)  # the SMS side delivered and logged nseq 2
    broker.mark_connected(ALICE, "127.0.0.3:4000")
    broker.handle_frame(ALICE, encode(Ack(upto=3)))
    assert [e.fields["nseq"] for e in sink.named("notify_delivered")] == [1, 3]


def test_overflow_drops_are_reported_in_missed_once(store: BrokerStore, clock: FakeClock) -> None:
    sink = WaitingSink()
    broker = make_broker(store, clock, sink, queue=QueueConfig(max_per_uri=2))
    subscribe(broker, ALICE, "a")
    for n in range(5):
        publish(broker, f"m{n}", "a")
    assert [e.fields["nseq"] for e in sink.named("notify_dropped")] == [1, 2, 3]
    broker.mark_connected(ALICE)
    batch = notifies(broker, ALICE)
    assert [(n.nseq, n.missed) for n in batch] == [(4, 3), (5, 0)]
    broker.mark_connected(ALICE)  # re-sent after a reconnection: same count
    assert [(n.nseq, n.missed) for n in notifies(broker, ALICE)] == [(4, 3), (5, 0)]
    broker.handle_frame(ALICE, encode(Ack(upto=5)))
    publish(broker, "m5", "a")
    assert [(n.nseq, n.missed) for n in notifies(broker, ALICE)] == [(6, 0)]


def test_users_just_connected_have_their_missed_counts_read_once_for_all(
    store: BrokerStore, clock: FakeClock
) -> None:
    """Issue 14: the first notification after a connection looks for overflow drops;
    a hundred users connecting, then a fan-out, made a take_missed each (a connection
    and a read each). One read for all now; only a user with drops takes them."""
    users = [f"sip:u{i}@example.com" for i in range(5)]
    broker = make_broker(store, clock, MemorySink(), queue=QueueConfig(max_per_uri=2))
    for uri in users:
        subscribe(broker, uri, "a")
    subscribe(broker, users[0], "b")
    for n in range(3):
        publish(broker, f"b{n}", "b")  # users[0]: one dropped
    broker.handle_frame(users[0], encode(Ack(upto=3)))  # and its queue emptied
    broker.flush_acks()
    for uri in users:
        broker.mark_connected(uri)
    calls: list[str] = []
    real_take, real_many = store.queues.take_missed, store.queues.missed_many

    def take_missed(uri: str) -> int:
        calls.append(uri)
        return real_take(uri)

    def missed_many(uris: Sequence[str]) -> dict[str, int]:
        calls.append(",".join(uris))
        return real_many(uris)

    store.queues.take_missed = take_missed  # type: ignore[method-assign]
    store.queues.missed_many = missed_many  # type: ignore[method-assign]
    publish(broker, "a0", "a")
    taken = broker.take_batches(users)
    assert calls == [",".join(users), users[0]]
    notes = {u: [decode(i.data) for i in items] for u, items in taken.items()}
    assert [(n.nseq, n.missed) for n in notes[users[0]]] == [(4, 1)]  # type: ignore[union-attr]
    assert all([(n.nseq, n.missed) for n in notes[u]] == [(1, 0)] for u in users[1:])  # type: ignore[union-attr]


def test_config_is_validated() -> None:
    for bad_subs in (
        {"default_ttl": 0},
        {"default_ttl": 10.0, "max_ttl": 5.0},
        {"sweep_interval": float("inf")},
    ):
        with pytest.raises(ConfigError):
            SubscriptionConfig(**bad_subs)
    for bad_queue in (
        {"window": 0},
        {"window_bytes": 0},
        {"max_per_uri": True},
        {"overflow": "drop-all"},
    ):
        with pytest.raises(ConfigError):
            QueueConfig(**bad_queue)
    assert BrokerCoreConfig(queue=QueueConfig(window=5)).window == 5


def test_a_database_failure_is_answered_with_500(store: BrokerStore, clock: FakeClock) -> None:
    broker = make_broker(store, clock, MemorySink())
    subscribe(broker, ALICE, "a")
    with store.engine.begin() as conn:  # break the store under the broker
        conn.execute(sa.text("DROP TABLE published_messages"))
    reply = one(broker.handle_frame(PUBLISHER, encode(Pub(req=5, msg_id="m", subject="a"))))
    assert isinstance(reply, Error) and (reply.req, reply.code) == (5, 500)
    assert store.queues.pending(ALICE) == []


def test_churn_log_sink_writes_section_8_records(tmp_path: Path, clock: FakeClock) -> None:
    log = ChurnLog(tmp_path / "churn.jsonl", "broker-1", clock)
    sink = ChurnLogSink(log)
    sink.emit("notify_queued", ALICE, nseq=3, queue_depth=2, reason=None)
    sink.emit("notify_queued", ALICE, sub_id=3)  # not a section 8 field: counted, not raised
    sink.emit("no_such_event", ALICE)
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "churn.jsonl").read_text().splitlines()]
    assert lines == [
        {
            "ts": "2023-11-14T22:13:20.000Z",
            "node": "broker-1",
            "event": "notify_queued",
            "uri": ALICE,
            "queue_depth": 2,
            "nseq": 3,
        }
    ]
    assert sink.failures == 2


def test_publishes_arriving_together_share_one_transaction(
    store: BrokerStore, clock: FakeClock
) -> None:
    sink = MemorySink()
    broker = make_broker(store, clock, sink)
    subscribe(broker, ALICE, "a")
    calls: list[list[str]] = []
    real = store.queues.publish_many

    def counting(requests: Any, **kwargs: Any) -> Any:
        calls.append([r.msg_id for r in requests])
        return real(requests, **kwargs)

    store.queues.publish_many = counting  # type: ignore[method-assign]
    pub = [encode(Pub(req=n, msg_id=f"m{n}", subject="a")) for n in range(5)]
    replies = broker.handle_frames(
        [
            (PUBLISHER, pub[0]),
            (BOB, encode(Ack(upto=1))),  # an ack does not split the group
            (PUBLISHER, pub[1]),
            (BOB, pub[2]),
            (BOB, b"\x00"),  # nor does a bad frame
            (CAROL, encode(Sub(req=9, subject="b"))),  # a sub does: it may change matches
            (PUBLISHER, pub[3]),
            (PUBLISHER, pub[1]),  # a re-send: a duplicate within the group
        ]
    )
    assert calls == [["m0", "m1", "m2"], ["m3", "m1"]]
    kinds = [[type(f).__name__ for f in r] for r in replies]
    assert kinds == [
        ["PubOk"],
        [],
        ["PubOk"],
        ["PubOk"],
        ["Error"],
        ["SubOk"],
        ["PubOk"],
        ["PubOk"],
    ]
    assert [e.fields["nseq"] for e in sink.named("notify_queued")] == [1, 2, 3, 4]
    assert [q[1] for q in queued(store, ALICE)] == ["m0", "m1", "m2", "m3"]


def test_a_failed_group_commit_answers_each_publish_with_500(
    store: BrokerStore, clock: FakeClock
) -> None:
    broker = make_broker(store, clock, MemorySink())
    subscribe(broker, ALICE, "a")

    def failing(requests: Any, **kwargs: Any) -> Any:
        raise StoreError("publish failed: disk on fire")

    store.queues.publish_many = failing  # type: ignore[method-assign]
    pubs = [encode(Pub(req=n, msg_id=f"m{n}", subject="a")) for n in (1, 2)]
    replies = broker.handle_frames([(PUBLISHER, p) for p in pubs])
    assert [(r[0].req, r[0].code) for r in replies] == [(1, 500), (2, 500)]  # type: ignore[union-attr]
    assert queued(store, ALICE) == []


def test_a_backlog_is_refilled_by_half_windows(store: BrokerStore, clock: FakeClock) -> None:
    broker = make_broker(store, clock, MemorySink(), queue=QueueConfig(window=4))
    add_session(store, ALICE)
    subscribe(broker, ALICE, "a")
    for n in range(7):
        publish(broker, f"m{n}", "a")
    broker.mark_connected(ALICE)
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2, 3, 4]
    broker.handle_frame(ALICE, encode(Ack(upto=1)))
    assert notifies(broker, ALICE) == []  # room 1 of 4: wait for half a window
    assert queued(store, ALICE)[0][0] == 1  # and the ack is still held
    broker.handle_frame(ALICE, encode(Ack(upto=2)))
    assert [n.nseq for n in notifies(broker, ALICE)] == [5, 6]
    assert [q[0] for q in queued(store, ALICE)] == [3, 4, 5, 6, 7]
    broker.handle_frame(ALICE, encode(Ack(upto=4)))
    assert [n.nseq for n in notifies(broker, ALICE)] == [7]  # short read: backlog done
    broker.handle_frame(ALICE, encode(Ack(upto=5)))
    publish(broker, "m7", "a")
    assert [n.nseq for n in notifies(broker, ALICE)] == [8]  # at once, with room 2 of 4


def test_the_window_is_bounded_in_bytes_too(store: BrokerStore, clock: FakeClock) -> None:
    """``window_bytes`` bounds what a user holds un-acked whatever the count allows; one
    notification always goes when nothing is in flight, however large."""
    add_session(store, ALICE)
    probe = make_broker(store, clock, MemorySink())
    subscribe(probe, ALICE, "a")
    for n in range(6):
        publish(probe, f"m{n}", "a")
    probe.mark_connected(ALICE)
    size = len(probe.take_batch(ALICE)[0].data)  # every frame here is this size

    queue = QueueConfig(window=100, window_bytes=2 * size + 1)
    broker = make_broker(store, clock, MemorySink(), queue=queue)
    broker.mark_connected(ALICE)
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2]  # a third is over the bytes
    assert notifies(broker, ALICE) == []
    broker.handle_frame(ALICE, encode(Ack(upto=1)))
    assert [n.nseq for n in notifies(broker, ALICE)] == [3]
    broker.handle_frame(ALICE, encode(Ack(upto=3)))
    assert [n.nseq for n in notifies(broker, ALICE)] == [4, 5]
    broker.mark_disconnected(ALICE, "test")  # what was in flight no longer counts
    broker.mark_connected(ALICE)
    assert [n.nseq for n in notifies(broker, ALICE)] == [4, 5]

    tiny = make_broker(store, clock, MemorySink(), queue=QueueConfig(window_bytes=1))
    tiny.mark_connected(ALICE)
    assert [n.nseq for n in notifies(tiny, ALICE)] == [4]  # over the bytes, alone: sent
    assert notifies(tiny, ALICE) == []
    for nseq in (4, 5, 6):
        tiny.handle_frame(ALICE, encode(Ack(upto=nseq)))
        assert [n.nseq for n in notifies(tiny, ALICE)] == ([nseq + 1] if nseq < 6 else [])
    assert queued(store, ALICE) == []
    link = tiny._links[ALICE]  # idle again: no per-nseq sizes kept (memory per session)
    assert link.sizes is None and link.inflight_bytes == 0


def _count_acks(store: BrokerStore) -> list[list[tuple[str, int]]]:
    """Every ``ack_many`` call from now on, as the list of acks it applied together."""
    calls: list[list[tuple[str, int]]] = []
    real = store.queues.ack_many

    def counting(acks: Sequence[tuple[str, int]]) -> list[int]:
        calls.append(list(acks))
        return real(acks)

    store.queues.ack_many = counting  # type: ignore[method-assign]
    return calls


def test_a_fan_out_is_taken_and_its_acks_applied_together(
    store: BrokerStore, clock: FakeClock
) -> None:
    """Issue 14: one take_batches for every woken user, one transaction for the acks of
    a batch of frames, not one call and one transaction per user."""
    broker = make_broker(store, clock, MemorySink())
    users = [ALICE, BOB, CAROL]
    for uri in users:
        add_session(store, uri)
        subscribe(broker, uri, "a")
        broker.mark_connected(uri)
    publish(broker, "m0", "a")
    batches = broker.take_batches([*users, "sip:nobody@example.com"])
    assert {uri: [n.nseq for n in b] for uri, b in batches.items()} == {u: [1] for u in users}
    assert broker.take_batches(users) == {}  # nothing new: nobody is listed
    acks = _count_acks(store)
    replies = broker.handle_frames([(uri, encode(Ack(upto=1))) for uri in users])
    assert replies == [[], [], []]
    # Each stream went idle: the three acks were applied at once, after the batch.
    assert acks == [[(ALICE, 1), (BOB, 1), (CAROL, 1)]]
    assert all(queued(store, uri) == [] for uri in users)


def test_held_acks_of_a_wake_are_applied_in_one_transaction(
    store: BrokerStore, clock: FakeClock
) -> None:
    broker = make_broker(store, clock, MemorySink(), queue=QueueConfig(window=4))
    for uri in (ALICE, BOB):
        add_session(store, uri)
        subscribe(broker, uri, "a")
    for n in range(6):
        publish(broker, f"m{n}", "a")
    for uri in (ALICE, BOB):
        broker.mark_connected(uri)
    assert {u: len(b) for u, b in broker.take_batches([ALICE, BOB]).items()} == {
        ALICE: 4,
        BOB: 4,
    }
    acks = _count_acks(store)
    broker.handle_frames([(ALICE, encode(Ack(upto=2))), (BOB, encode(Ack(upto=3)))])
    assert acks == []  # still in flight: held
    taken = broker.take_batches([ALICE, BOB])
    assert acks == [[(ALICE, 2), (BOB, 3)]]
    assert {u: [n.nseq for n in b] for u, b in taken.items()} == {ALICE: [5, 6], BOB: [5, 6]}


def test_a_user_whose_missed_count_fails_is_left_unchanged_and_the_others_taken(
    store: BrokerStore, clock: FakeClock
) -> None:
    broker = make_broker(store, clock, MemorySink(), queue=QueueConfig(max_per_uri=1))
    for uri in (ALICE, BOB):
        add_session(store, uri)
        subscribe(broker, uri, "a")
        broker.mark_connected(uri)
    publish(broker, "m0", "a")
    publish(broker, "m1", "a")  # drops m0: both have a missed count to take
    real = store.queues.take_missed

    def failing_for_alice(uri: str) -> int:
        if uri == ALICE:
            raise StoreError("take_missed failed: disk on fire")
        return real(uri)

    store.queues.take_missed = failing_for_alice  # type: ignore[method-assign]
    taken = broker.take_batches([ALICE, BOB])
    assert list(taken) == [BOB] and broker.in_flight(ALICE) == ()
    with pytest.raises(StoreError):
        broker.take_batch(ALICE)  # alone, the error is the caller's
    store.queues.take_missed = real  # type: ignore[method-assign]
    assert [(n.nseq, n.missed) for n in notifies(broker, ALICE)] == [(2, 1)]  # nothing lost


def test_handle_decoded_answers_as_handle_frames_for_frames_decoded_once(
    store: BrokerStore, clock: FakeClock
) -> None:
    """The service decodes each frame to admit it and hands the frame over (issue 14);
    bytes that did not decode come as their FrameError and are answered as before."""
    broker = make_broker(store, clock, MemorySink())
    subscribe(broker, ALICE, "a")
    pub = Pub(req=3, msg_id="m0", subject="a")
    bad = b"\xa1cop"  # a map cut short
    with pytest.raises(FrameError) as caught:
        decode(bad)
    replies = broker.handle_decoded([(PUBLISHER, pub), (BOB, caught.value), (PUBLISHER, pub)])
    again = broker.handle_frames([(PUBLISHER, encode(pub)), (BOB, bad)])
    assert replies == [*again, [PubOk(req=3, msg_id="m0", matched=1)]]
    assert isinstance(replies[1][0], Error) and replies[1][0].code == 400
    assert [q[1] for q in queued(store, ALICE)] == ["m0"]  # the copies were duplicates


class _Heard:
    """A QueueListener that records what it hears."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def queued(self, uri: str) -> None:
        pass

    def acked(self, uri: str) -> None:
        self.told.append(uri)


def test_handle_and_take_refills_the_acking_users_window_in_the_same_call(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(store, clock, sink, queue=QueueConfig(window=2))
    heard = _Heard()
    broker.listener = heard
    for uri in (ALICE, BOB):
        add_session(store, uri)
        subscribe(broker, uri, "a.b")
        broker.mark_connected(uri)
    for i in range(4):
        publish(broker, f"m{i}", "a.b")
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2]
    assert [n.nseq for n in notifies(broker, BOB)] == [1, 2]
    replies, taken = broker.handle_and_take(
        [(ALICE, Ack(upto=2)), (BOB, Ack(upto=1))], frozenset({ALICE})
    )
    assert replies == [[], []]
    # Alice's window was refilled here and she is not woken; Bob (not served) is.
    assert [item.nseq for item in taken[ALICE]] == [3, 4]
    assert [decode(item.data).nseq for item in taken[ALICE]] == [3, 4]  # type: ignore[union-attr]
    assert BOB not in taken
    assert heard.told == [BOB]
    assert broker.in_flight(ALICE) == (3, 4)
