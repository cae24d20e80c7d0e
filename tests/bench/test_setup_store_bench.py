"""Benchmark of the store calls one session set-up makes, on SQLite: the HA1 read twice
(REGISTER and INVITE answers), the bindings read and written, the session claimed, a
subscription added; each call its own transaction, as the broker's database thread
makes them.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_setup_store_bench.py``. It prints
the CPU time (this thread's, so the disk's fsync waits are not in it) per set-up of the
store calls and of the reference: the same statements and commits through the
``sqlite3`` driver alone, so the ratio is what the repositories (SQLAlchemy, row
mapping) add to what SQLite itself costs. Figures go to docs/benchmarks.md ("Session
set-up and memory per session"). ``BENCH_SETUPS`` changes the count (default 2,000).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config

from mdeci.store.base import make_engine
from mdeci.store.bindings import Binding, SqlBindingStore
from mdeci.store.sessions import SessionRecord, SessionStatus, SqlSessionStore
from mdeci.store.subscriptions import SqlSubscriptionStore
from mdeci.store.users import SqlUserStore

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
SETUPS = int(os.environ.get("BENCH_SETUPS", "2000"))
WARM = 200
DOMAIN = "bench.example"


def _timed(one: Callable[[int], None], first: int) -> float:
    """CPU seconds of this thread per call of ``one`` over ``SETUPS`` new users."""
    for i in range(WARM):
        one(first + i)
    cpu0 = time.thread_time()
    for i in range(SETUPS):
        one(first + WARM + i)
    return (time.thread_time() - cpu0) / SETUPS


def test_store_cpu_per_setup(tmp_path: Path) -> None:
    path = tmp_path / "broker.db"
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["url"] = f"sqlite:///{path}"
    command.upgrade(cfg, "head")
    engine = make_engine(f"sqlite:///{path}")
    users, bindings = SqlUserStore(engine), SqlBindingStore(engine)
    sessions, subs = SqlSessionStore(engine), SqlSubscriptionStore(engine)

    def repositories(i: int) -> None:
        uri = f"sip:u{i}@{DOMAIN}"
        users.get_credentials(f"u{i}", DOMAIN, "SHA-256")
        bindings.bindings(uri, 1000.0)
        bindings.put(Binding(uri, f"<sip:u{i}@127.0.0.1:5060>", 5000.0, "c", 2, 1.0, "a"))
        users.get_credentials(f"u{i}", DOMAIN, "SHA-256")
        record = SessionRecord(
            uri, "c", "lt", "rt", f"sip:u{i}@127.0.0.1", "", "v=0", "127.0.0.1:9",
            bytes(32), None, SessionStatus.CONNECTED, 1, 2, 1000.0, 1000.0,
        )  # fmt: skip
        sessions.upsert_session(record, "bench", None)
        subs.add_subscription(uri, f"rss.u{i}", "", 3600.0, 1000.0)

    # The reference: the same statements and commits on the driver's own connection,
    # with the pragmas the store sets (WAL, synchronous=FULL).
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")

    def driver(i: int) -> None:
        uri, user = f"sip:u{i}@{DOMAIN}", f"u{i}"
        ha1 = "SELECT ha1_sha256 FROM users WHERE username = ? AND realm = ?"
        db.execute(ha1, (user, DOMAIN)).fetchone()
        db.execute(
            "SELECT aor, contact, expires_at, call_id, cseq, q, source FROM bindings "
            "WHERE aor = ? AND expires_at > ? ORDER BY q DESC, contact",
            (uri, 1000.0),
        ).fetchall()
        db.execute("BEGIN")
        db.execute(
            "INSERT INTO bindings (aor, contact, expires_at, call_id, cseq, q, source) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (aor, contact) DO UPDATE SET "
            "expires_at = excluded.expires_at, call_id = excluded.call_id, "
            "cseq = excluded.cseq, q = excluded.q, source = excluded.source",
            (uri, f"<sip:u{i}@127.0.0.1:5061>", 5000.0, "c", 2, 1.0, "a"),
        )
        db.execute("COMMIT")
        db.execute(ha1, (user, DOMAIN)).fetchone()
        db.execute("BEGIN")
        db.execute("SELECT owner FROM sessions WHERE uri = ?", (uri,)).fetchone()
        db.execute(
            "INSERT INTO sessions (uri, call_id, local_tag, remote_tag, remote_target, "
            "route_set, remote_sdp, media_addr, session_key, msisdn, status, local_cseq, "
            "remote_cseq, started_at, updated_at, transport, owner, epoch) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT (uri) DO "
            "UPDATE SET epoch = sessions.epoch + 1 RETURNING epoch",
            (uri, "c", "lt", "rt", uri, "", "v=0", "127.0.0.1:9", bytes(32), None,
             "CONNECTED", 1, 2, 1000.0, 1000.0, "rudp", "bench"),
        ).fetchone()  # fmt: skip
        db.execute("COMMIT")
        db.execute("BEGIN")
        db.execute(
            "INSERT INTO subscriptions (uri, subject, filter, created_at, expires_at, "
            "qclass, in_order) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (uri, f"rss.u{i}", "", 1000.0, 4600.0, None, False),
        ).fetchone()
        db.execute("COMMIT")

    try:
        ours = _timed(repositories, 0)
        reference = _timed(driver, 10 * (SETUPS + WARM))
    finally:
        db.close()
        engine.dispose()
    print(
        f"\nstore calls of one set-up, CPU: {ours * 1e6:.0f} µs through the repositories, "
        f"{reference * 1e6:.0f} µs through the sqlite3 driver alone (reference); "
        f"ratio {ours / reference:.2f}; load {os.getloadavg()[0]:.2f}"
    )
    assert ours > 0 and reference > 0
