"""Bindings in one SQLite file (WAL), shared by the worker processes of
``python -m sip registrar --workers N``: a REGISTER taken by one worker is seen by all.

SQL lives here and not in ``mdeci/store`` because the SIP stack must not import mdeci
(tests/test_layering.py); the broker keeps its bindings through
``mdeci.store.bindings.SqlBindingStore``. Only the standard library's ``sqlite3``.

Writes are serialised by SQLite's write lock (``BEGIN IMMEDIATE``), so the registrar's
read-check-write of one REGISTER (§10.3 steps 6-7) is atomic across workers. Between
:meth:`SqliteBindingStore.begin` and :meth:`~SqliteBindingStore.commit` every call joins
one transaction (a batch of REGISTERs, one commit); outside, each call commits alone.
``synchronous=NORMAL``: a commit survives the process, not a power cut (a registrar's
bindings are refreshed by their clients anyway; Kamailio's default keeps them in memory
only).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from sip.registrar import Binding

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS bindings (aor TEXT NOT NULL, contact TEXT NOT NULL, "
    "expires_at REAL NOT NULL, call_id TEXT NOT NULL, cseq INTEGER NOT NULL, "
    "q REAL NOT NULL, source TEXT, PRIMARY KEY (aor, contact)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS bindings_expires ON bindings (expires_at)",
)
_COLUMNS = "aor, contact, expires_at, call_id, cseq, q, source"
_SELECT = f"SELECT {_COLUMNS} FROM bindings WHERE aor = ? AND expires_at > ?"
# An update in place when the contact is known (a refresh), not REPLACE's delete+insert.
_UPSERT = (
    f"INSERT INTO bindings ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (aor, contact) "
    "DO UPDATE SET expires_at = excluded.expires_at, call_id = excluded.call_id, "
    "cseq = excluded.cseq, q = excluded.q, source = excluded.source"
)


class SqliteBindingStore:
    """A :class:`sip.registrar.BindingStore` in a SQLite file (module docstring).

    Raises :class:`sqlite3.Error` when the database fails (the caller answers 500)."""

    def __init__(self, path: Path, busy_timeout: float = 10.0) -> None:
        # No busy handler of SQLite's own: it sleeps 1 ms at least, which at thousands of
        # REGISTERs a second lets a worker's socket overflow while the other commits.
        self._db = sqlite3.connect(str(path), timeout=0.0, isolation_level=None)
        self._busy_timeout = busy_timeout
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._batch = False
        with self._transaction():
            for statement in _SCHEMA:
                self._db.execute(statement)

    def close(self) -> None:
        """Close the connection (a batch still open is rolled back)."""
        self._db.close()

    # ------------------------------------------------------------ batches

    def begin(self) -> None:
        """Start a batch: the calls until :meth:`commit` form one transaction, opened
        at the first of them (a batch that touches nothing costs nothing)."""
        self._batch = True

    def commit(self) -> None:
        """End the batch, committing what it did."""
        self._batch = False
        if self._db.in_transaction:
            self._db.execute("COMMIT")

    def rollback(self) -> None:
        """End the batch, undoing what it did."""
        self._batch = False
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def _transaction(self) -> _Txn:
        return _Txn(self._db, self._batch, self._busy_timeout)

    def _batched(self) -> bool:
        """Inside a batch: open its transaction at the first call; True. Else False (the
        call runs in a transaction of its own)."""
        if not self._batch:
            return False
        if not self._db.in_transaction:
            _begin(self._db, self._busy_timeout)
        return True

    # ------------------------------------------------------------ BindingStore

    def bindings(self, aor: str, now: float) -> list[Binding]:
        """Unexpired bindings of ``aor``."""
        if self._batched():  # the hot path: no transaction object per call
            rows = self._db.execute(_SELECT, (aor, now)).fetchall()
        else:
            with self._transaction():
                rows = self._db.execute(_SELECT, (aor, now)).fetchall()
        return [Binding(*row) for row in rows]

    def put(self, binding: Binding) -> None:
        """Insert or replace by (aor, contact)."""
        b = binding
        values = (b.aor, b.contact, b.expires_at, b.call_id, b.cseq, b.q, b.source)
        if self._batched():
            self._db.execute(_UPSERT, values)
        else:
            with self._transaction():
                self._db.execute(_UPSERT, values)

    def remove(self, aor: str, contact: str) -> None:
        """Delete one binding if present."""
        with self._transaction():
            self._db.execute("DELETE FROM bindings WHERE aor = ? AND contact = ?", (aor, contact))

    def remove_all(self, aor: str) -> None:
        """Delete every binding of ``aor``."""
        with self._transaction():
            self._db.execute("DELETE FROM bindings WHERE aor = ?", (aor,))

    def expire(self, now: float) -> list[Binding]:
        """Delete and return the expired bindings (each reported by one worker only)."""
        with self._transaction():
            rows = self._db.execute(
                f"DELETE FROM bindings WHERE expires_at <= ? RETURNING {_COLUMNS}", (now,)
            ).fetchall()
        return [Binding(*row) for row in rows]


def _begin(db: sqlite3.Connection, timeout: float) -> None:
    """BEGIN IMMEDIATE (the write lock), retried every 200 us while another worker holds
    it, for at most ``timeout`` seconds. Raises sqlite3.OperationalError."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.0002)


class _Txn:
    """BEGIN IMMEDIATE unless already inside one; COMMIT (or ROLLBACK) at the end
    unless a batch goes on."""

    def __init__(self, db: sqlite3.Connection, batch: bool, timeout: float) -> None:
        self._db = db
        self._batch = batch
        self._timeout = timeout
        self._own = False

    def __enter__(self) -> None:
        if not self._db.in_transaction:
            _begin(self._db, self._timeout)
            self._own = not self._batch

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if not self._own:
            return
        self._db.execute("ROLLBACK" if exc is not None else "COMMIT")
