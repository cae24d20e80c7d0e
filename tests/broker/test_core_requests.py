"""The broker core's requests (sub, unsub, list, pub, ack) and subscription TTLs, on a
migrated store with a fake clock."""

from __future__ import annotations

from collections.abc import Sequence

import cbor2
import pytest

from mdeci.broker import MemorySink
from mdeci.broker.matcher import filter_cost
from mdeci.config import QueueConfig, SubscriptionConfig
from mdeci.filters import MAX_FILTER_LENGTH, compile_filter
from mdeci.frames import (
    Ack,
    Error,
    List,
    Pub,
    PubOk,
    Renew,
    Sub,
    SubOk,
    Subs,
    Unsub,
    encode,
)
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import T0, FakeClock, add_session, make_broker
from tests.broker.core_helpers import (
    ALICE,
    BOB,
    CAROL,
    PUBLISHER,
    notifies,
    one,
    publish,
    queued,
    subscribe,
)

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


def _longest_filter(i: int) -> str:
    """A filter of the largest length, every node a comparison ``a != i`` (all evaluated
    when ``a`` is another number): the most a filter can cost."""
    unit, text = f"a != {i}", f"a != {i}"
    while len(text) + len(f" and {unit}") <= MAX_FILTER_LENGTH:
        text += f" and {unit}"
    return text


def test_the_filter_cost_of_a_users_subscriptions_is_bounded(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    """A hundred subscriptions on ``#`` with the longest filters: those past the user's
    filter cost are refused (403, nothing stored), so a publish evaluates at most
    ``max_filter_cost`` filter nodes for that user; another user is not affected."""
    limit = SubscriptionConfig().max_filter_cost
    broker = make_broker(store, clock, sink)
    costs, refused = [], []
    for i in range(100):
        text = _longest_filter(i)
        reply = one(broker.handle_frame(ALICE, encode(Sub(req=i, subject="#", filter=text))))
        if isinstance(reply, SubOk):
            costs.append(filter_cost(compile_filter(text).expr))
        else:
            refused.append(reply)
    assert costs and sum(costs) <= limit, costs
    assert len(refused) == 100 - len(costs)
    assert all(isinstance(r, Error) and r.code == 403 for r in refused), refused[:1]
    assert "filter cost limit" in refused[0].message  # type: ignore[union-attr]
    assert len(store.subscriptions.list_subscriptions(ALICE, T0)) == len(costs)
    small = subscribe(broker, ALICE, "quotes.#", "Price < 25")  # room for a cheap one
    assert small.sub_id
    assert isinstance(one(broker.handle_frame(BOB, encode(Sub(req=1, subject="#")))), SubOk)
    # Expired subscriptions give their cost back.
    clock.advance(SubscriptionConfig().default_ttl + 1)
    text = _longest_filter(0)
    assert isinstance(
        one(broker.handle_frame(ALICE, encode(Sub(req=200, subject="#", filter=text)))), SubOk
    )


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


def test_renew_extends_a_live_subscription_and_refuses_a_lapsed_one(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = make_broker(
        store, clock, sink, subscriptions=SubscriptionConfig(default_ttl=10.0, max_ttl=50.0)
    )
    sub = subscribe(broker, ALICE, "a.*", "x > 1")
    clock.advance(8)
    renewed = one(broker.handle_frame(ALICE, encode(Renew(req=3, sub_id=sub.sub_id))))
    assert isinstance(renewed, SubOk)
    assert (renewed.req, renewed.sub_id, renewed.expires_at) == (3, sub.sub_id, T0 + 18)
    clock.advance(5)  # past the first expiry, before the renewed one
    assert publish(broker, "m1", "a.b", x=2).matched == 1
    assert publish(broker, "m2", "a.b", x=0).matched == 0  # the filter is kept
    longer = one(broker.handle_frame(ALICE, encode(Renew(req=4, sub_id=sub.sub_id, ttl=999))))
    assert isinstance(longer, SubOk) and longer.expires_at == T0 + 13 + 50  # clamped
    bobs = one(broker.handle_frame(BOB, encode(Renew(req=5, sub_id=sub.sub_id))))
    assert isinstance(bobs, Error) and bobs.code == 404
    for unknown in ("999", "x"):
        reply = one(broker.handle_frame(ALICE, encode(Renew(req=6, sub_id=unknown))))
        assert isinstance(reply, Error) and reply.code == 404
    clock.advance(50)  # expires_at == now: lapsed, never brought back
    lapsed = one(broker.handle_frame(ALICE, encode(Renew(req=7, sub_id=sub.sub_id))))
    assert isinstance(lapsed, Error) and (lapsed.req, lapsed.code) == (7, 404)
    assert publish(broker, "m3", "a.b", x=2).matched == 0
    assert [s.sub_id for s in store.subscriptions.list_subscriptions(ALICE, T0)] == []


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
    duplicate, past it a new publish (the table does not keep every msg_id for good)."""
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
    broker.mark_connected(ALICE, ("127.0.0.1", 4000))
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
