"""PostgreSQL's publish transaction pipelined (mdeci/store/publish_tx.py): two round trips
to the server whatever the batch, measured through a proxy that delays every answer of
the server; the commit still the last thing the call waits for."""

from __future__ import annotations

import contextlib
import heapq
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import Engine, make_url

from mdeci.store.base import make_engine
from mdeci.store.errors import StoreError
from mdeci.store.queues import PublishRequest, SqlQueueStore, StoredRow
from tests.store.test_queue_failures import _kill, _pooled_pids, failing_commits
from tests.store.test_queues import ALICE, PUB

# Added to every answer of the server: large against the rest of a publish on a loaded
# machine, so that the count of round trips is what the time shows.
DELAY = 0.2


class DelayingProxy:
    """A TCP proxy to ``upstream`` that holds each chunk the server sends for ``DELAY``
    seconds (what the client sends goes at once); chunks keep their order, and chunks
    sent together arrive together: a round trip costs one ``DELAY``, however many
    answers it brings back."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._socks: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed: stop
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
                self._socks += (client, server)
                threading.Thread(target=self._pump, args=(client, server, 0.0), daemon=True).start()
                threading.Thread(
                    target=self._pump, args=(server, client, DELAY), daemon=True
                ).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
        due: list[tuple[float, int, bytes]] = []
        ready = threading.Condition()
        done = threading.Event()

        def send() -> None:
            with contextlib.suppress(OSError):
                while True:
                    with ready:
                        while not due and not done.is_set():
                            ready.wait()
                        if not due:
                            return
                        at, _, data = due[0]
                        if at > time.monotonic():
                            ready.wait(at - time.monotonic())
                            continue
                        heapq.heappop(due)
                    dst.sendall(data)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        n = 0
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                with ready:
                    n += 1
                    heapq.heappush(due, (time.monotonic() + delay, n, data))
                    ready.notify()
        done.set()
        with ready:
            ready.notify()

    def close(self) -> None:
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def delayed(engine: Engine) -> Iterator[Engine]:
    """``engine``'s database (PostgreSQL only) through a :class:`DelayingProxy`."""
    if engine.dialect.name != "postgresql":
        pytest.skip("round trips to a server: PostgreSQL only")
    url = engine.url
    proxy = DelayingProxy((url.host or "127.0.0.1", url.port or 5432))
    slow = make_engine(make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(False))
    try:
        yield slow
    finally:
        slow.dispose()
        proxy.close()


def _requests(prefix: str, n: int) -> list[PublishRequest]:
    return [
        PublishRequest(PUB, f"{prefix}{i}", "z", b"\xa0", b"x", False, 1.0, [(ALICE, 1)])
        for i in range(n)
    ]


def _timed_publish(q: SqlQueueStore, requests: list[PublishRequest]) -> float:
    start = time.monotonic()
    q.publish_many(requests, max_depth=100, policy="drop-oldest")
    return time.monotonic() - start


def test_a_postgresql_publish_batch_takes_two_round_trips(delayed: Engine) -> None:
    """BEGIN, the record and the locks in one round trip; the queued rows, the
    counters, the wake-up of other brokers and COMMIT in the second. One statement a
    round trip would take seven."""
    q = SqlQueueStore(delayed)
    q.node = "here"  # the wake-up of other brokers is sent too
    _timed_publish(q, _requests("warm", 1))  # the pool's connection opened
    for prefix, n in (("one", 1), ("many", 32)):
        elapsed = _timed_publish(q, _requests(prefix, n))
        assert 2 * DELAY <= elapsed < 3 * DELAY, (n, elapsed)
    assert [n.nseq for n in q.pending(ALICE, limit=100)] == list(range(1, 35))


def test_a_postgresql_duplicate_and_an_overflow_wait_for_their_answers(delayed: Engine) -> None:
    """The rare statements (a duplicate's count, an overflow's drop) read their answer
    before the plan goes on: a round trip each, and the results are the same as
    without the pipeline."""
    q = SqlQueueStore(delayed)
    q.publish_many(_requests("m", 2), max_depth=2, policy="drop-oldest")
    start = time.monotonic()
    results = q.publish_many(
        [*_requests("m", 1), *_requests("n", 1)], max_depth=2, policy="drop-oldest"
    )
    assert 4 * DELAY <= time.monotonic() - start < 5 * DELAY
    assert [(r.matched, r.duplicate) for r in results] == [(1, True), (1, False)]
    assert [(d.nseq, d.msg_id) for d in results[1].dropped] == [(1, "m0")]
    assert [n.nseq for n in q.pending(ALICE)] == [2, 3]


def test_a_postgresql_pipelined_commit_that_fails_hands_back_nothing(engine: Engine) -> None:
    """The COMMIT is sent with the last statements and answered last: when the server
    refuses it, the call raises (the broker answers 503, never pub-ok), ``written``
    stays empty, nothing is recorded, and the connection serves the next publish."""
    if engine.dialect.name != "postgresql":
        pytest.skip("the pipelined commit: PostgreSQL only")
    q = SqlQueueStore(engine)
    written: list[StoredRow] = []
    with failing_commits(engine), pytest.raises(StoreError, match="refused at commit"):
        q.publish_many(_requests("m", 3), max_depth=10, policy="drop-oldest", written=written)
    assert written == [] and q.depth(ALICE) == 0
    results = q.publish_many(_requests("m", 3), max_depth=10, policy="drop-oldest", written=written)
    assert not any(r.duplicate for r in results) and len(written) == 3


def test_a_postgresql_libpq_without_pipeline_mode_publishes_statement_by_statement(
    delayed: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A libpq before 14 has no pipeline mode: the same transaction goes one statement
    a round trip (BEGIN, record, lock, insert, counters, wake-up, COMMIT), with the same
    results."""
    monkeypatch.setattr(psycopg.Pipeline, "is_supported", staticmethod(lambda: False))
    q = SqlQueueStore(delayed)
    q.node = "here"
    _timed_publish(q, _requests("warm", 1))
    elapsed = _timed_publish(q, _requests("many", 3))
    assert elapsed >= 7 * DELAY
    assert [n.nseq for n in q.pending(ALICE)] == [1, 2, 3, 4]
    assert [
        r.duplicate for r in q.publish_many(_requests("many", 1), max_depth=9, policy="drop-oldest")
    ] == [True]


def test_a_postgresql_connection_killed_under_the_pipeline_costs_one_error(
    engine: Engine,
) -> None:
    """The pipeline runs on the driver's connection, outside SQLAlchemy's handling: a
    server that ends its connections (a restart, a failover) costs one StoreError, the
    pool's dead connections are not handed out again, and the next publish works."""
    if engine.dialect.name != "postgresql":
        pytest.skip("a server-side kill of pooled connections: PostgreSQL only")
    q = SqlQueueStore(engine)
    q.publish_many(_requests("a", 1), max_depth=10, policy="drop-oldest")
    _kill(engine, _pooled_pids(engine, 3))
    failures = 0
    for i in range(4):
        try:
            q.publish_many(_requests(f"b{i}", 1), max_depth=10, policy="drop-oldest")
        except StoreError:
            failures += 1
    assert failures == 1
    assert [n.msg_id for n in q.pending(ALICE)] == ["a0", "b10", "b20", "b30"]
