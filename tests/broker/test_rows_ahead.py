"""The rows a publish queued, handed to connected users from memory.

A connected user whose queue the core knows (``_Link.known``) is served the rows the
core's own publishes just wrote without reading them back, and an empty queue is not
read again after an ack. These tests check that it reads no more, and that what it
sends is exactly what reading the store gives, whatever happens in between (windows,
overflow, acks beyond what was sent, reconnections, sweeps): a second broker on a copy
of the store that always reads (``forget_rows``) must send the same bytes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdeci.broker import Broker, MemorySink
from mdeci.broker.delivery import AHEAD_LIMIT, OutgoingNotify
from mdeci.config import OverflowPolicy, QueueConfig
from mdeci.frames import Ack, Error, Frame, Pub, PubOk, Sub, SubOk, encode
from mdeci.store.base import make_engine
from mdeci.store.errors import StoreError
from mdeci.store.queues import DeliveryRow
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock, add_session, make_broker

USERS = ("sip:u0@example.com", "sip:u1@example.com", "sip:u2@example.com")
PUBLISHER = "sip:feed@example.com"
# u0 and u1 follow "a", u1 and u2 follow "b": a publish reaches a subset.
FOLLOWS = {"a": USERS[:2], "b": USERS[1:]}


def _reads(store: BrokerStore) -> list[list[str]]:
    """Every ``pending_many`` call from now on, as the users it read."""
    calls: list[list[str]] = []
    real = store.queues.pending_many

    def counting(
        reads: Sequence[tuple[str, int, int]], epochs: Mapping[str, int] | None = None
    ) -> list[list[DeliveryRow]]:
        calls.append([uri for uri, _, _ in reads])
        return real(reads, epochs)

    store.queues.pending_many = counting  # type: ignore[method-assign]
    return calls


def _subscribe_all(broker: Broker) -> None:
    for subject, users in FOLLOWS.items():
        for uri in users:
            reply = broker.handle(uri, Sub(req=1, subject=subject))
            assert isinstance(reply[0], SubOk), reply


def _pubs(subject: str, msg_ids: Sequence[str], payload: bytes = b"p") -> list[tuple[str, Frame]]:
    return [
        (PUBLISHER, Pub(req=i + 1, msg_id=m, subject=subject, payload=payload + m.encode()))
        for i, m in enumerate(msg_ids)
    ]


def _sent(taken: dict[str, list[OutgoingNotify]]) -> dict[str, list[tuple[int, bytes]]]:
    return {uri: [(item.nseq, item.data) for item in items] for uri, items in taken.items()}


def test_a_fan_out_is_served_without_reading_back_what_it_queued(
    store: BrokerStore, clock: FakeClock
) -> None:
    """Neither reads back each recipient's rows nor an acking user's empty queue."""
    broker = make_broker(store, clock, MemorySink())
    for uri in USERS:
        add_session(store, uri)
    _subscribe_all(broker)
    for uri in USERS:
        broker.mark_connected(uri)
    assert broker.take_batches(USERS) == {}  # one read: the queues are empty
    reads = _reads(store)
    replies, _ = broker.handle_and_take(_pubs("a", ["m0", "m1"]) + _pubs("b", ["m2"]), ())
    assert [type(r[0]).__name__ for r in replies] == ["PubOk"] * 3
    taken = _sent(broker.take_batches(USERS))
    assert reads == []  # served from memory
    assert {uri: [n for n, _ in items] for uri, items in taken.items()} == {
        USERS[0]: [1, 2],
        USERS[1]: [1, 2, 3],
        USERS[2]: [1],
    }
    # The same bytes as a broker that reads them from the store sends.
    probe = make_broker(store, clock, MemorySink())
    for uri in USERS:
        probe.mark_connected(uri)
    assert _sent(probe.take_batches(USERS)) == taken
    reads.clear()
    acks: list[tuple[str, Frame]] = [(uri, Ack(upto=items[-1][0])) for uri, items in taken.items()]
    _, refilled = broker.handle_and_take(acks, frozenset(USERS))
    assert refilled == {} and reads == []  # nothing waits: not read again


def test_once_rows_are_forgotten_every_take_reads_the_store(
    store: BrokerStore, clock: FakeClock
) -> None:
    """After ``forget_rows`` (an SMS side removes rows) a publish to a user whose queue
    was read empty is still delivered: no link is taken as known any more."""
    broker = make_broker(store, clock, MemorySink())
    add_session(store, USERS[0])
    _subscribe_all(broker)
    broker.mark_connected(USERS[0])
    broker.forget_rows()
    assert broker.take_batches([USERS[0]]) == {}
    reads = _reads(store)
    broker.handle_and_take(_pubs("a", ["m0"]), ())
    assert [n for n, _ in _sent(broker.take_batches([USERS[0]]))[USERS[0]]] == [1]
    assert reads == [[USERS[0]]]


def test_a_user_further_behind_than_the_rows_kept_is_read_from_the_store(
    store: BrokerStore, clock: FakeClock
) -> None:
    broker = make_broker(store, clock, MemorySink(), queue=QueueConfig(window=2))
    add_session(store, USERS[0])
    _subscribe_all(broker)
    broker.mark_connected(USERS[0])
    assert broker.take_batches([USERS[0]]) == {}
    reads = _reads(store)
    ids = [f"m{i}" for i in range(AHEAD_LIMIT + 3)]
    broker.handle_and_take(_pubs("a", ids), ())
    assert [n for n, _ in _sent(broker.take_batches([USERS[0]]))[USERS[0]]] == [1, 2]
    assert reads == [[USERS[0]]]  # more than AHEAD_LIMIT behind: forgotten, read
    link = broker.core._links[USERS[0]]
    assert link.ahead is None and not link.known


@contextmanager
def _twin_stores(template: Path) -> Iterator[tuple[BrokerStore, BrokerStore]]:
    # In memory where there is a tmpfs: each publish's commit syncs the file.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        engines = []
        for name in ("memory.db", "store.db"):
            shutil.copyfile(template, Path(tmp) / name)
            engines.append(make_engine(f"sqlite:///{Path(tmp) / name}"))
        try:
            yield BrokerStore(engines[0]), BrokerStore(engines[1])
        finally:
            for engine in engines:
                engine.dispose()


_OPS = st.one_of(
    st.tuples(
        st.just("pub"),
        st.sampled_from(["a", "b"]),
        st.lists(st.integers(0, 30), min_size=1, max_size=4),  # msg_ids: some repeat
    ),
    st.tuples(st.just("take"), st.lists(st.sampled_from(USERS), min_size=1, max_size=3)),
    st.tuples(st.just("ack"), st.sampled_from(USERS), st.integers(-1, 1)),
    st.tuples(st.just("connect"), st.sampled_from(USERS)),
    st.tuples(st.just("disconnect"), st.sampled_from(USERS)),
    st.tuples(st.just("sweep")),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(_OPS, max_size=25),
    window=st.integers(1, 4),
    frames_in_bytes=st.sampled_from([1, 2, 1000]),
    depth=st.integers(1, 5),
    policy=st.sampled_from(list(OverflowPolicy)),
)
def test_rows_from_memory_are_exactly_what_the_store_gives(
    sqlite_template: Path,
    ops: list[tuple[object, ...]],
    window: int,
    frames_in_bytes: int,
    depth: int,
    policy: OverflowPolicy,
) -> None:
    """Differential: the same frames in the same order on two stores; one broker may
    serve from memory, the other always reads the store. Every answer must match."""
    clock = FakeClock()
    frame_size = 120  # about one notify frame here: window_bytes of 1 or 2 frames, or many
    queue = QueueConfig(
        window=window,
        window_bytes=frames_in_bytes * frame_size,
        max_per_uri=depth,
        overflow=policy,
    )
    with _twin_stores(sqlite_template) as (store_a, store_b):
        brokers = [make_broker(s, clock, MemorySink(), queue=queue) for s in (store_a, store_b)]
        brokers[1].forget_rows()
        for broker, store in zip(brokers, (store_a, store_b), strict=True):
            for uri in USERS:
                add_session(store, uri)
            _subscribe_all(broker)
            for uri in USERS:
                broker.mark_connected(uri)
        for op in ops:
            clock.advance(0.5)
            outcomes: list[object] = []
            for broker in brokers:
                if op[0] == "pub":
                    ids = [f"m{i}" for i in cast(list[int], op[2])]
                    replies, _ = broker.handle_and_take(_pubs(str(op[1]), ids), ())
                    outcomes.append(replies)
                elif op[0] == "take":
                    outcomes.append(_sent(broker.take_batches(cast(list[str], op[1]))))
                elif op[0] == "ack":
                    uri = str(op[1])
                    flying = broker.in_flight(uri)
                    upto = max((flying[-1] if flying else 0) + cast(int, op[2]), 0)
                    if upto:
                        replies, taken = broker.handle_and_take([(uri, Ack(upto=upto))], {uri})
                        outcomes.append((replies, _sent(taken)))
                elif op[0] == "connect":
                    broker.mark_connected(str(op[1]))
                elif op[0] == "disconnect":
                    broker.mark_disconnected(str(op[1]), "test")
                else:
                    broker.sweep()
            assert outcomes[:1] == outcomes[1:], op
            assert [b.in_flight(u) for u in USERS for b in brokers[:1]] == [
                b.in_flight(u) for u in USERS for b in brokers[1:]
            ]
        # What is left queued is the same too.
        assert [store_a.queues.pending(u) for u in USERS] == [
            store_b.queues.pending(u) for u in USERS
        ]


def test_an_encoded_publish_is_sent_as_a_read_gives_it(
    store: BrokerStore, clock: FakeClock
) -> None:
    """Attrs, urgency and a clock giving an int: the rows kept are what a read gives."""
    clock.now = 1_700_000_123  # an int: the stored REAL reads back as a float
    broker = make_broker(store, clock, MemorySink())
    add_session(store, USERS[0])
    _subscribe_all(broker)
    broker.mark_connected(USERS[0])
    assert broker.take_batches([USERS[0]]) == {}
    frame = Pub(req=1, msg_id="x", subject="a", attrs={"k": 1.5, "s": "v"}, urgent=True)
    broker.handle_and_take([(PUBLISHER, frame)], ())
    link = broker.core._links[USERS[0]]
    assert link.ahead is not None
    [read] = store.queues.pending_many([(USERS[0], 0, 10)])
    assert link.ahead == read
    assert [type(v) for v in link.ahead[0]] == [type(v) for v in read[0]]
    taken = _sent(broker.take_batches([USERS[0]]))
    probe = make_broker(store, clock, MemorySink())
    probe.mark_connected(USERS[0])
    assert _sent(probe.take_batches([USERS[0]])) == taken
    assert encode(frame)  # the frame itself was valid


class _Woken:
    """A QueueListener that records who it was told had rows queued."""

    def __init__(self) -> None:
        self.queued_for: list[str] = []

    def queued(self, uri: str) -> None:
        self.queued_for.append(uri)

    def acked(self, uri: str) -> None:
        pass


def test_a_publish_committed_but_reported_failed_is_read_from_the_store(
    store: BrokerStore, clock: FakeClock
) -> None:
    """A publish whose COMMIT reached the server but whose connection was lost before
    the answer: the publisher gets 503 and its retry is a duplicate that queues nothing.
    The user's link does not take its empty queue as known (the row would wait for the
    next sweep): it reads the store again and is woken."""
    broker = make_broker(store, clock, MemorySink())
    woken = _Woken()
    broker.listener = woken
    add_session(store, USERS[0])
    _subscribe_all(broker)
    broker.mark_connected(USERS[0])
    assert broker.take_batches([USERS[0]]) == {}  # read empty: the link is known
    real = store.queues.publish_many

    def commits_then_fails(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise StoreError("publish failed: OperationalError: server closed the connection")

    store.queues.publish_many = commits_then_fails  # type: ignore[method-assign]
    replies = broker.handle_and_take(_pubs("a", ["m0"]), ())[0]
    store.queues.publish_many = real  # type: ignore[method-assign]
    assert isinstance(replies[0][0], Error) and replies[0][0].code == 503
    assert woken.queued_for == list(FOLLOWS["a"])  # both targets, connected or not
    assert [n for n, _ in _sent(broker.take_batches([USERS[0]]))[USERS[0]]] == [1]
    retry = broker.handle_and_take(_pubs("a", ["m0"]), ())[0]
    assert isinstance(retry[0][0], PubOk)  # a duplicate: acknowledged, not queued again
    assert broker.take_batches([USERS[0]]) == {}


def test_rows_kept_and_frames_in_flight_stay_within_window_bytes(
    store: BrokerStore, clock: FakeClock
) -> None:
    """docs/operations.md: ``window_bytes`` is what a user that does not ack holds.
    Before, the rows kept ahead had a ``window_bytes`` of their own on top of the
    frames in flight (twice the bound). Nothing is lost by the bound: every row still
    goes out once the user acks."""
    limit = 1000
    broker = make_broker(store, clock, MemorySink(), queue=QueueConfig(window_bytes=limit))
    uri = USERS[0]
    add_session(store, uri)
    _subscribe_all(broker)
    broker.mark_connected(uri)
    assert broker.take_batches([uri]) == {}
    got: list[int] = []
    for i in range(8):
        broker.handle_and_take(_pubs("a", [f"m{i}"], payload=b"x" * 200), ())
        got += [n for n, _ in _sent(broker.take_batches([uri])).get(uri, [])]
        link = broker.core._links[uri]
        assert link.ahead_bytes + link.inflight_bytes <= limit
    assert got and len(got) < 8  # the window filled: some rows wait
    while len(got) < 8:
        _, taken = broker.handle_and_take([(uri, Ack(upto=got[-1]))], {uri})
        got += [n for n, _ in _sent(taken).get(uri, [])]
    assert got == list(range(1, 9))
