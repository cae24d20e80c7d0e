"""LISTEN/NOTIFY between brokers: a publish through one store handle wakes the broker
listening on another, for the recipients that other brokers hold."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from mdeci.store import wake
from mdeci.store.repo import BrokerStore
from tests.store.test_sessions import ALICE, BOB, _session

GUARD = 10.0  # seconds: only against a hang


@pytest.fixture
def pg(engine: Engine) -> Engine:
    if engine.dialect.name != "postgresql":
        pytest.skip("LISTEN/NOTIFY: PostgreSQL only (SQLite has one broker)")
    return engine


@pytest.fixture
def heard(pg: Engine) -> Iterator[queue.Queue[str]]:
    """The URIs a listener on ``pg``'s store hears, from the time it listens."""
    got: queue.Queue[str] = queue.Queue()
    listening, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=wake.listen, args=(pg.url, got.put, listening.set, stop), daemon=True
    )
    thread.start()
    assert listening.wait(GUARD)
    yield got
    stop.set()
    thread.join(GUARD)
    assert not thread.is_alive()


def _publish(store: BrokerStore, msg_id: str, *uris: str) -> None:
    store.queues.publish(
        "sip:carol@example.com",
        msg_id,
        "s",
        b"\xa0",
        b"p",
        urgent=False,
        published_at=1000.0,
        targets=[(uri, 1) for uri in uris],
        max_depth=10,
        policy="drop-oldest",
    )


def test_a_publish_wakes_the_broker_holding_a_recipient(
    pg: Engine, heard: queue.Queue[str]
) -> None:
    a = BrokerStore(pg, "a")
    a.sessions.upsert_session(_session(ALICE), owner="b")  # b holds alice
    a.sessions.upsert_session(_session(BOB, call_id="c2"), owner="a")  # a holds bob
    _publish(a, "m1", ALICE, BOB, "sip:nobody@example.com")
    assert heard.get(timeout=GUARD) == ALICE
    # Only b's user: a wakes its own users itself, and nobody holds the third.
    _publish(a, "m2", ALICE)
    assert heard.get(timeout=GUARD) == ALICE
    assert heard.empty()


def test_one_broker_alone_sends_no_wake_up(pg: Engine, heard: queue.Queue[str]) -> None:
    alone = BrokerStore(pg)  # no node: the single-broker store
    alone.sessions.upsert_session(_session(ALICE), owner="b")
    _publish(alone, "m1", ALICE)
    # A marker published after it, by a named node, arrives alone: the first sent none.
    _publish(BrokerStore(pg, "a"), "m2", ALICE)
    assert heard.get(timeout=GUARD) == ALICE
    assert heard.empty()
