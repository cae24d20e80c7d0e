"""The broker core's delivery (batches, windows, acks, missed counts, churn log, group
commits), on a migrated store with a fake clock."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from mdeci.broker import BrokerCoreConfig, ChurnLogSink, MemorySink
from mdeci.churnlog import ChurnLog
from mdeci.config import QueueConfig, SubscriptionConfig
from mdeci.errors import ConfigError, FrameError
from mdeci.frames import (
    Ack,
    Error,
    Pub,
    PubOk,
    Sub,
    decode,
    encode,
)
from mdeci.store.errors import StoreError
from mdeci.store.repo import BrokerStore
from rudp.fields import NO_ENTRIES
from tests.broker.conftest import FakeClock, WaitingSink, add_session, make_broker
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
from tests.store.test_queue_failures import failing_commits

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
    broker.mark_connected(ALICE, ("127.0.0.1", 4000))
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
    assert broker.take_batch(ALICE) == []
    broker.mark_connected(ALICE, ("127.0.0.1", 4001))
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
    broker.mark_connected(ALICE, ("127.0.0.2", 4000))
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2, 3, 4]
    broker.mark_connected(ALICE, ("127.0.0.3", 4000))  # the re-INVITE after a move
    clock.advance(0.5)
    broker.handle_frame(ALICE, encode(Ack(upto=2)))  # sent at 127.0.0.2, acked now
    assert [n.nseq for n in notifies(broker, ALICE)] == [3, 4, 5, 6]
    broker.mark_disconnected(ALICE, "rudp: no ACK after retries")
    broker.handle_frame(ALICE, encode(Ack(upto=4)))  # it got them before failing
    broker.mark_connected(ALICE, ("127.0.0.4", 4000))
    assert [n.nseq for n in notifies(broker, ALICE)] == [5, 6]
    broker.handle_frame(ALICE, encode(Ack(upto=6)))
    delivered = [(e.fields["nseq"], e.fields["latency_ms"]) for e in sink.named("notify_delivered")]
    assert delivered == [(1, 500.0), (2, 500.0), (3, 500.0), (4, 500.0), (5, 500.0), (6, 500.0)]
    assert store.queues.depth(ALICE) == 0
    # What earlier connections sent is kept beside the links, and only while some is
    # unacknowledged: a link is twelve slots.
    assert broker.core._earlier == {} and sys.getsizeof(broker.core._links[ALICE]) <= 128


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
    broker.mark_connected(ALICE, ("127.0.0.2", 4000))
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2, 3]
    broker.mark_disconnected(ALICE, "rudp: no ACK after retries")
    broker.delivered_elsewhere(ALICE, 2)  # the SMS side delivered and logged nseq 2
    broker.mark_connected(ALICE, ("127.0.0.3", 4000))
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


def test_a_connected_user_is_held_by_its_link_alone(store: BrokerStore, clock: FakeClock) -> None:
    """An idle connected user, never sent anything, costs the delivery core its link and
    no entry in any other table (a broker holds 100,000 of them)."""
    broker = make_broker(store, clock, MemorySink())
    subscribe(broker, ALICE, "a")
    broker.mark_connected(ALICE, ("127.0.0.1", 4000))
    assert broker.take_batch(ALICE) == []
    holding = [
        name
        for name, table in vars(broker.core).items()
        if isinstance(table, dict | set | list) and ALICE in table
    ]
    assert holding == ["_links"]


def test_a_drop_while_connected_is_reported_in_the_next_missed(
    store: BrokerStore, clock: FakeClock
) -> None:
    """The missed count taken at the first notify after the connection is not the last
    word: an overflow while connected is reported by the next notify."""
    sink = WaitingSink()
    broker = make_broker(store, clock, sink, queue=QueueConfig(max_per_uri=2, window=1))
    subscribe(broker, ALICE, "a")
    broker.mark_connected(ALICE)
    publish(broker, "m0", "a")
    assert [(n.nseq, n.missed) for n in notifies(broker, ALICE)] == [(1, 0)]
    for n in range(1, 4):
        publish(broker, f"m{n}", "a")
    assert [e.fields["nseq"] for e in sink.named("notify_dropped")] == [1, 2]
    broker.handle_frame(ALICE, encode(Ack(upto=1)))
    assert [(n.nseq, n.missed) for n in notifies(broker, ALICE)] == [(3, 2)]


def test_users_just_connected_have_their_missed_counts_read_once_for_all(
    store: BrokerStore, clock: FakeClock
) -> None:
    """The first notification after a connection looks for overflow drops: a hundred
    users connecting, then a fan-out, take one read for all, not a take_missed (a
    connection and a read) each; only a user with drops takes them."""
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


def test_a_database_failure_is_answered_with_503(store: BrokerStore, clock: FakeClock) -> None:
    broker = make_broker(store, clock, MemorySink())
    subscribe(broker, ALICE, "a")
    with store.engine.begin() as conn:  # break the store under the broker
        conn.execute(sa.text("DROP TABLE published_messages"))
    reply = one(broker.handle_frame(PUBLISHER, encode(Pub(req=5, msg_id="m", subject="a"))))
    assert isinstance(reply, Error) and (reply.req, reply.code) == (5, 503)
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


def test_a_failed_group_commit_answers_each_publish_with_503(
    store: BrokerStore, clock: FakeClock
) -> None:
    broker = make_broker(store, clock, MemorySink())
    subscribe(broker, ALICE, "a")

    def failing(requests: Any, **kwargs: Any) -> Any:
        raise StoreError("publish failed: disk on fire")

    store.queues.publish_many = failing  # type: ignore[method-assign]
    pubs = [encode(Pub(req=n, msg_id=f"m{n}", subject="a")) for n in (1, 2)]
    replies = broker.handle_frames([(PUBLISHER, p) for p in pubs])
    assert [(r[0].req, r[0].code) for r in replies] == [(1, 503), (2, 503)]  # type: ignore[union-attr]
    assert queued(store, ALICE) == []


def test_a_group_whose_commit_the_database_refuses_gets_no_pub_ok(
    any_store: BrokerStore, clock: FakeClock
) -> None:
    """The commit itself fails (on PostgreSQL the server refuses the COMMIT that the
    pipeline sent with the group's last statements): every publish of the group is
    answered 503, none pub-ok, nothing is queued or handed on; sent again, each is
    published once."""
    store = any_store
    sink = MemorySink()
    broker = make_broker(store, clock, sink)
    add_session(store, ALICE)
    subscribe(broker, ALICE, "a")
    broker.mark_connected(ALICE)
    pubs = [encode(Pub(req=n, msg_id=f"m{n}", subject="a")) for n in (1, 2)]
    with failing_commits(store.engine):
        replies = broker.handle_frames([(PUBLISHER, p) for p in pubs])
    assert [(type(r[0]).__name__, r[0].code) for r in replies] == [("Error", 503)] * 2  # type: ignore[union-attr]
    assert queued(store, ALICE) == [] and sink.named("notify_queued") == []
    assert notifies(broker, ALICE) == []
    replies = broker.handle_frames([(PUBLISHER, p) for p in pubs])
    assert [type(r[0]).__name__ for r in replies] == ["PubOk", "PubOk"]
    assert [n.nseq for n in notifies(broker, ALICE)] == [1, 2]
    assert [q[1] for q in queued(store, ALICE)] == ["m1", "m2"]


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
    link = tiny.core._links[ALICE]  # idle again: no per-nseq tables kept (memory per session)
    assert link.sizes is None and link.inflight_bytes == 0 and link.inflight is NO_ENTRIES
    broker.mark_disconnected(ALICE, "test")
    assert broker.core._links[ALICE].inflight is NO_ENTRIES


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
    """One take_batches for every woken user, one transaction for the acks of
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
    """The service decodes each frame to admit it and hands the frame over;
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
