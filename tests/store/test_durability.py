"""Durability (a committed call survives the process) and concurrent publishers."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

from sqlalchemy.engine import Engine

from mdeci.store.base import make_engine
from mdeci.store.bindings import Binding
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionRecord, SessionStatus

ROOT = Path(__file__).resolve().parents[2]
ALICE = "sip:alice@example.com"
BOB = "sip:bob@example.com"


def _fill(store: BrokerStore) -> int:
    store.users.add_user(ALICE, "example.com", "pw")
    store.bindings.put(Binding(ALICE, "<sip:alice@10.0.0.1>", 500.0, "c", 1))
    store.sessions.upsert_session(
        SessionRecord(
            ALICE, "c", "lt", "rt", "<sip:a@1>", "", "v=0", "10.0.0.1:9", b"k" * 32,
            None, SessionStatus.CONNECTED, 1, 1, 1.0, 1.0,
        )
    )  # fmt: skip
    sub = store.subscriptions.add_subscription(ALICE, "a.b", "", 100.0, 0.0)
    store.queues.publish(
        BOB, "m1", "a.b", b"\xa0", b"x", urgent=False, published_at=1.0,
        targets=[(ALICE, sub.sub_id)], max_depth=10, policy="drop-oldest",
    )  # fmt: skip
    return sub.sub_id


def _check(store: BrokerStore, sub_id: int) -> None:
    assert [u.uri for u in store.users.list_users()] == [ALICE]
    assert [b.contact for b in store.bindings.bindings(ALICE, 0.0)] == ["<sip:alice@10.0.0.1>"]
    session = store.sessions.get_session(ALICE)
    assert session is not None and session.session_key == b"k" * 32
    assert [s.sub_id for s in store.subscriptions.active_subscriptions(0.0)] == [sub_id]
    assert [(p.nseq, p.sub_id, p.payload) for p in store.queues.pending(ALICE)] == [
        (1, sub_id, b"x")
    ]
    assert store.queues.publish(
        BOB, "m1", "a.b", b"", b"", urgent=False, published_at=2.0,
        targets=[], max_depth=10, policy="drop-oldest",
    ).duplicate  # fmt: skip


def test_data_survives_dispose_and_a_new_engine(sqlite_path: Path) -> None:
    url = f"sqlite:///{sqlite_path}"
    first = make_engine(url)
    sub_id = _fill(BrokerStore(first))
    first.dispose()
    second = make_engine(url)
    try:
        _check(BrokerStore(second), sub_id)
    finally:
        second.dispose()


KILLER = """
import os, signal, sys
sys.path.insert(0, {root!r})
from mdeci.store.base import make_engine
from mdeci.store.repo import BrokerStore
from tests.store.test_durability import _fill
print(_fill(BrokerStore(make_engine({url!r}))), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_data_survives_kill_9_right_after_the_calls_return(engine: Engine) -> None:
    url = engine.url.render_as_string(hide_password=False)
    proc = subprocess.run(
        [sys.executable, "-c", KILLER.format(root=str(ROOT), url=url)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr
    _check(BrokerStore(engine), int(proc.stdout))


def test_two_threads_publishing_to_one_user_get_gapless_increasing_nseqs(
    engine: Engine,
) -> None:
    store = BrokerStore(engine)
    per_thread = 20
    got: dict[int, list[int]] = {0: [], 1: []}
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def run(worker: int) -> None:
        try:
            barrier.wait()
            for n in range(per_thread):
                # Both users in every publish, listed in opposite orders by the two workers:
                # the store must lock them in one order and never deadlock.
                targets = [(ALICE, worker), (BOB, worker)]
                result = store.queues.publish(
                    f"sip:w{worker}@example.com", f"{uuid.uuid4()}", "s", b"", b"%d" % n,
                    urgent=False, published_at=float(n), max_depth=10_000,
                    targets=targets if worker else targets[::-1], policy="drop-oldest",
                )  # fmt: skip
                got[worker].extend(e.nseq for e in result.queued if e.uri == ALICE)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    for worker in (0, 1):
        assert got[worker] == sorted(got[worker]) and len(set(got[worker])) == per_thread
    assert sorted(got[0] + got[1]) == list(range(1, 2 * per_thread + 1))
    assert [p.nseq for p in store.queues.pending(ALICE, limit=1000)] == list(
        range(1, 2 * per_thread + 1)
    )
    assert store.queues.last_nseq(BOB) == 2 * per_thread
