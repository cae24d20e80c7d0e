"""The database thread (mdeci/broker/worker.py): order, the core's thread binding, the
hand-back to the loop, and the bounded HA1 cache of the SIP side."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from mdeci.broker import BrokerService
from mdeci.broker.errors import WrongThreadError
from mdeci.broker.sink import FieldValue, Row
from mdeci.broker.sip_auth import CachedCredentials
from mdeci.broker.worker import DbWorker, LoopQueue, LoopSink
from mdeci.frames import Sub, SubOk
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock, WaitingSink, make_broker
from tests.broker.test_service import FAST, HOST

ALICE = "sip:alice@example.com"


async def test_calls_run_on_one_thread_in_the_order_they_were_made() -> None:
    worker = DbWorker()
    try:
        seen: list[tuple[int, int]] = []

        def note(n: int) -> None:
            seen.append((n, threading.get_ident()))

        for n in range(50):
            worker.post("test", note, n)
        last = await worker.run(lambda: len(seen))
        assert last == 50
        assert [n for n, _ in seen] == list(range(50))
        assert {t for _, t in seen} == {worker.thread_id} != {threading.get_ident()}
    finally:
        worker.close()


async def test_consecutive_batched_posts_share_one_call_and_nothing_moves_past_another() -> None:
    """Items posted while the thread is busy join the batch queued last, unless another
    call came between them; a batch that started takes no more."""
    worker = DbWorker()
    try:
        held, running, release = threading.Event(), threading.Event(), threading.Event()
        calls: list[list[int] | str] = []

        def batch(items: list[int]) -> None:
            calls.append(list(items))

        def hold() -> None:
            held.set()
            release.wait(10)

        worker.post("test", hold)
        for n in range(5):
            worker.post_batch("test", batch, n)
        worker.post("test", calls.append, "between")
        for n in range(5, 8):
            worker.post_batch("test", batch, n)
        await asyncio.to_thread(held.wait, 10)
        release.set()
        assert await worker.run(lambda: list(calls)) == [[0, 1, 2, 3, 4], "between", [5, 6, 7]]

        # A batch that already runs takes nothing more: the item goes into a new one.
        def slow(items: list[int]) -> None:
            running.set()
            release2.wait(10)
            calls.append(list(items))

        release2 = threading.Event()
        calls.clear()
        worker.post_batch("test", slow, 1)
        await asyncio.to_thread(running.wait, 10)
        worker.post_batch("test", slow, 2)
        release2.set()
        assert await worker.run(lambda: list(calls)) == [[1], [2]]
    finally:
        worker.close()


async def test_a_failed_posted_call_is_logged_and_the_next_ones_run() -> None:
    worker = DbWorker()
    try:

        def boom() -> None:
            raise ValueError("bug")

        worker.post("test", boom)
        assert await worker.run(lambda: "still serving") == "still serving"
    finally:
        worker.close()


async def test_a_cancelled_caller_loses_only_the_answer() -> None:
    """The call runs to its end (its change stands); the next calls are served."""
    worker = DbWorker()
    try:
        started, release, done = threading.Event(), threading.Event(), threading.Event()

        def slow() -> str:
            started.set()
            release.wait(10)
            done.set()
            return "late"

        caller = asyncio.create_task(worker.run(slow))
        await asyncio.to_thread(started.wait, 10)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        release.set()
        assert await worker.run(done.is_set)  # ran to its end, behind it in order
        with pytest.raises(ZeroDivisionError):
            await worker.run(lambda: 1 // 0)  # an error reaches its caller
    finally:
        worker.close()


async def test_a_closed_worker_ran_what_was_queued_and_takes_no_more() -> None:
    worker = DbWorker()
    seen: list[int] = []
    for n in range(20):
        worker.post("test", seen.append, n)
    worker.close()
    worker.close()  # idempotent
    assert seen == list(range(20))
    worker.post("test", seen.append, 99)  # dropped: nobody waits for it
    with pytest.raises(RuntimeError):
        await worker.run(len, seen)
    assert seen == list(range(20))


async def test_the_core_refuses_calls_from_the_loop_once_a_service_owns_it(
    store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    broker = make_broker(store, clock, sink)
    service = await BrokerService.open(broker, HOST, 0, FAST)
    try:
        with pytest.raises(WrongThreadError):
            broker.handle(ALICE, Sub(req=1, subject="a.b"))
        assert store.subscriptions.list_subscriptions(ALICE, clock()) == []  # no change
        [ok] = await service.worker.run(broker.handle, ALICE, Sub(req=1, subject="a.b"))
        assert isinstance(ok, SubOk)
        # Its churn event was made on the worker and reaches the sink on the loop.
        event = await asyncio.wait_for(sink.wait_for("subscription_added", ALICE), 10)
        assert "a.b" in str(event.fields["reason"])
    finally:
        await service.close()
        await service.close()  # idempotent


async def test_calls_handed_back_to_the_loop_keep_their_order() -> None:
    loop = asyncio.get_running_loop()
    queue = LoopQueue(loop)
    worker = DbWorker()
    got: list[tuple[int, bool]] = []
    loop_thread = threading.get_ident()
    done = asyncio.Event()
    try:

        def note(n: int) -> None:
            got.append((n, threading.get_ident() == loop_thread))

        def from_worker() -> None:
            for n in range(100):
                queue.call(note, n)
            queue.call(done.set)

        await worker.run(from_worker)
        await asyncio.wait_for(done.wait(), 10)
        assert got == [(n, True) for n in range(100)]
    finally:
        worker.close()


def test_the_ha1_cache_is_bounded_and_forgets_the_least_recent(store: BrokerStore) -> None:
    store.users.add_user("sip:a@d", "d", "pw-a", username="a")
    store.users.add_user("sip:b@d", "d", "pw-b", username="b")
    cache = CachedCredentials(store, ("SHA-256",), size=1)
    assert cache.ha1("a", "d", "SHA-256") is None  # never fetched: unknown
    cache.keep(cache.fetch("a", "d"))
    a = cache.ha1("a", "d", "SHA-256")
    assert a is not None and a == store.users.get_credentials("a", "d", "SHA-256")
    cache.keep(cache.fetch("b", "d"))
    assert cache.ha1("b", "d", "SHA-256") is not None
    assert cache.ha1("a", "d", "SHA-256") is None  # dropped: one entry at most


def test_the_ha1_cache_drops_the_first_fetched_and_keeps_digests_as_ints(
    store: BrokerStore,
) -> None:
    """A broker caches every session owner's HA1: a plain table of ints (an OrderedDict
    of bytes cost ~60 bytes more per user); a fetch again refreshes the value in place."""
    for name in "abc":
        store.users.add_user(f"sip:{name}@d", "d", f"pw-{name}", username=name)
    cache = CachedCredentials(store, ("SHA-256",), size=2)
    cache.keep(cache.fetch("a", "d"))
    cache.keep(cache.fetch("b", "d"))
    cache.keep(cache.fetch("a", "d"))  # refetched: still the first fetched
    cache.keep(cache.fetch("c", "d"))
    assert [cache.knows(name, "d") for name in "abc"] == [False, True, True]
    table = cache._tables[("d", "SHA-256")]
    assert type(table) is dict and all(isinstance(v, int) for v in table.values())
    assert cache.ha1("b", "d", "SHA-256") == store.users.get_credentials("b", "d", "SHA-256")
    assert list(cache._order[("d", "SHA-256")]) == list(table) == ["b", "c"]


def test_the_ha1_cache_gives_back_the_stored_text(store: BrokerStore) -> None:
    """Kept as bytes when its hex is lowercase, as text otherwise: read back unchanged."""
    store.users.add_user("sip:a@d", "d", "pw-a", username="a")
    cache = CachedCredentials(store, ("SHA-256",))
    stored = store.users.get_credentials("a", "d", "SHA-256")
    odd = {
        ("b", "d", "SHA-256"): "ABCDEF",
        ("c", "d", "SHA-256"): "not hex",
        ("e", "d", "MD5"): None,
        ("f", "d", "SHA-256"): "00" + "0a" * 31,  # leading zeros, kept as an int
        ("g", "d", "SHA-256"): "0x" + "0a" * 31,  # int() would read it: not lowercase hex
    }
    cache.keep({**cache.fetch("a", "d"), **odd})
    assert cache.ha1("a", "d", "SHA-256") == stored is not None
    assert cache.ha1("b", "d", "SHA-256") == "ABCDEF"
    assert cache.ha1("c", "d", "SHA-256") == "not hex"
    assert cache.ha1("f", "d", "SHA-256") == "00" + "0a" * 31
    assert cache.ha1("g", "d", "SHA-256") == "0x" + "0a" * 31
    assert isinstance(cache._tables[("d", "SHA-256")]["f"], int)
    assert cache.ha1("e", "d", "MD5") is None and cache.ha1("a", "other", "SHA-256") is None
    assert cache.knows("a", "d") and cache.knows("c", "d") and not cache.knows("e", "d")


class RowsSink:
    """Records each call it gets, rows and single events alike."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object]] = []

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        self.calls.append(("emit", event, (uri, fields)))

    def emit_rows(self, event: str, keys: tuple[str, ...], rows: Sequence[Row]) -> None:
        self.calls.append(("rows", event, (keys, list(rows))))


async def test_rows_from_the_worker_are_merged_on_the_loop_in_order() -> None:
    """An ack logs one row; the rows of consecutive calls reach the sink as one
    batch, and nothing changes place (another event, or another set of fields, ends a
    batch)."""
    loop = asyncio.get_running_loop()
    inner = RowsSink()
    queue = LoopQueue(loop)
    sink = LoopSink(inner, queue)
    done = asyncio.Event()
    d, q = ("nseq", "latency_ms"), ("nseq", "queue_depth")

    def from_worker() -> None:
        for n in range(3):
            sink.emit_rows("notify_delivered", d, [(ALICE, n, 1.5)])
        sink.emit_rows("notify_queued", q, [(ALICE, 9, 1), (ALICE, 10, 2)])
        sink.emit_rows("notify_delivered", d, [(ALICE, 3, 2.5)])
        sink.emit_rows("notify_delivered", ("nseq", "channel"), [(ALICE, 4, "sms")])
        sink.emit("subscription_added", ALICE, reason="r")
        sink.emit_rows("notify_delivered", d, [(ALICE, 5, 0.5)])
        sink.emit_rows("notify_delivered", d, [(ALICE, 6, 0.5)])
        queue.call(done.set)

    # The loop is held (join) while the thread queues everything: the merge is certain.
    thread = threading.Thread(target=from_worker)
    thread.start()
    thread.join(10)
    await asyncio.wait_for(done.wait(), 10)
    assert inner.calls == [
        ("rows", "notify_delivered", (d, [(ALICE, 0, 1.5), (ALICE, 1, 1.5), (ALICE, 2, 1.5)])),
        ("rows", "notify_queued", (q, [(ALICE, 9, 1), (ALICE, 10, 2)])),
        ("rows", "notify_delivered", (d, [(ALICE, 3, 2.5)])),
        ("rows", "notify_delivered", (("nseq", "channel"), [(ALICE, 4, "sms")])),
        ("emit", "subscription_added", (ALICE, {"reason": "r"})),
        ("rows", "notify_delivered", (d, [(ALICE, 5, 0.5), (ALICE, 6, 0.5)])),
    ]
