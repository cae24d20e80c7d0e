"""The ECI Session Manager's state, one row per user URI.

A row holds the user's dialog (Call-ID, tags, remote target, route set, CSeqs), the
remote SDP and the media address it gave, the data channel the answer accepted (RUDP or
QUIC), the session key and the optional MSISDN, and the user's status:

- ``CONNECTED``: the dialog is up and the media address answers;
- ``DISCONNECTED``: the dialog is up but RUDP sends fail (queue; urgent ones go by SMS);
- ``ENDED``: the dialog ended (BYE). The row is kept, so the MSISDN and the last media
  address stay known; the next INVITE replaces it with ``upsert_session``.

Each row also names the broker node that holds the user and the epoch it holds it at
(mdeci/store/ownership.py): ``upsert_session`` raises the epoch for a new session, and
the ``..._held`` writes change nothing for a broker whose epoch is no longer the user's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.engine import Connection, Engine, Row

from mdeci.store._sql import forget_old_pages, reading, transaction, upsert_statement
from mdeci.store.models import SessionRow
from mdeci.store.ownership import Held, Lost, holder_of


class SessionStatus(StrEnum):
    """The user's status as the Session Manager sees it."""

    CONNECTED = "CONNECTED"
    DISCONNECTED = "DISCONNECTED"
    ENDED = "ENDED"


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """The stored session of one user; ``dataclasses.replace`` it to change fields."""

    uri: str
    call_id: str
    local_tag: str
    remote_tag: str
    remote_target: str
    route_set: str
    remote_sdp: str
    media_addr: str
    session_key: bytes
    msisdn: str | None
    status: SessionStatus
    local_cseq: int
    remote_cseq: int
    started_at: float
    updated_at: float
    transport: str = "rudp"  # the data channel the SDP answer accepted ("rudp", "quic")


_NAMES = tuple(f.name for f in fields(SessionRecord))
_COLUMNS = tuple(getattr(SessionRow, name) for name in _NAMES)
# The columns a new session writes, the key aside.
_CHANGED = (*(name for name in _NAMES if name != "uri"), "owner")
# The row's owner before a claim (the churn log's handoff): the row is locked until the
# claim commits (PostgreSQL; SQLite has one writer).
_PREV_OWNER = select(SessionRow.owner).where(SessionRow.uri == bindparam("uri")).with_for_update()


def _status_statement(fenced: bool, ended: bool) -> Any:
    """A status change of one row: at the caller's epoch when ``fenced``; an ended
    session's secret cleared (of no use to anyone but an attacker reading the database)."""
    where = [SessionRow.uri == bindparam("s_uri")]
    if fenced:
        where.append(SessionRow.epoch == bindparam("s_epoch"))
    values: dict[str, Any] = {"status": bindparam("s_status"), "updated_at": bindparam("s_at")}
    if ended:
        values["session_key"] = b""
    return update(SessionRow).where(*where).values(values).returning(*_COLUMNS)


# Built once (every connect and disconnect writes a status).
_SET_STATUS = {(f, e): _status_statement(f, e) for f in (False, True) for e in (False, True)}


def _record(row: Row[Any]) -> SessionRecord:
    values = row._asdict()
    values["status"] = SessionStatus(values["status"])
    return SessionRecord(**values)


class SqlSessionStore:
    """Sessions in SQL; every method is one committed transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # A new session replaces the row whole and raises the epoch (built once: every
        # INVITE runs it).
        self.claim_statement = upsert_statement(
            engine,
            cast(Table, SessionRow.__table__),
            ("uri",),
            _CHANGED,
            {"epoch": SessionRow.epoch + 1},
        ).returning(SessionRow.epoch)
        # A refresh rewrites the row only at the epoch its caller holds.
        self.refresh_statement = (
            update(SessionRow)
            .where(SessionRow.uri == bindparam("w_uri"), SessionRow.epoch == bindparam("w_epoch"))
            .values({name: bindparam(name) for name in _CHANGED})
            .returning(SessionRow.epoch)
        )

    def upsert_session(
        self, session: SessionRecord, owner: str = "", held: int | None = None
    ) -> Held | Lost:
        """Store the session of ``session.uri``, replacing any previous one whole, held by
        broker node ``owner`` (mdeci/store/ownership.py).

        ``held`` None: a new session; the user's epoch is raised in the same statement
        (the newest INVITE wins, whichever broker took it). Otherwise a refresh of the
        session the caller holds at epoch ``held``: written only if the epoch is still
        that (else :class:`Lost`, nothing written). The epoch the caller holds now.

        Raises:
            StoreError: the database failed.
        """
        with self.batch("upsert_session") as writes:
            return writes.upsert(session, owner, held)

    def get_session(self, uri: str) -> SessionRecord | None:
        """The session of ``uri``, or None if it never had one.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "get_session") as conn:
            row = conn.execute(select(*_COLUMNS).where(SessionRow.uri == uri)).one_or_none()
        return None if row is None else _record(row)

    def set_status(self, uri: str, status: SessionStatus, now: float) -> SessionRecord | None:
        """Set the status (and ``updated_at = now``; ENDED also clears ``session_key``); the
        updated session, or None if none.

        Raises:
            StoreError: the database failed.
        """
        found = self._set_status(uri, status, now, None)
        return None if isinstance(found, Lost) else found

    def set_status_held(
        self, uri: str, status: SessionStatus, now: float, epoch: int
    ) -> SessionRecord | Lost:
        """:meth:`set_status` by the broker that holds ``uri`` at ``epoch``: nothing is
        written (:class:`Lost`) if the user's epoch changed.

        Raises:
            StoreError: the database failed.
        """
        return self._set_status(uri, status, now, epoch)

    def _set_status(
        self, uri: str, status: SessionStatus, now: float, epoch: int | None
    ) -> SessionRecord | Lost:
        with self.batch("set_status") as writes:
            return writes.set_status(uri, status, now, epoch)

    @contextmanager
    def batch(self, what: str = "session writes") -> Iterator[SessionWrites]:
        """Several session writes in one transaction, committed (durable) on exit: one
        commit for a burst of them, as a broker's restart or a storm of reconnections
        makes. Nothing of it is written if any of it fails.

        Raises:
            StoreError: the database failed; the transaction was rolled back.
        """
        with transaction(self._engine, what) as conn:
            writes = SessionWrites(self, conn)
            yield writes
        if writes.cleared_key:
            forget_old_pages(self._engine, "checkpoint after a key was cleared")

    def end_session(self, uri: str, now: float) -> SessionRecord | None:
        """Mark the dialog ended (status ``ENDED``); the ended session, or None if none.

        Raises:
            StoreError: the database failed.
        """
        return self.set_status(uri, SessionStatus.ENDED, now)

    def sessions_with_status(self, status: SessionStatus) -> list[SessionRecord]:
        """Every session with this status, ordered by URI (e.g. CONNECTED at restart).

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "sessions_with_status") as conn:
            rows = conn.execute(
                select(*_COLUMNS)
                .where(SessionRow.status == str(SessionStatus(status)))
                .order_by(SessionRow.uri)
            ).all()
        return [_record(row) for row in rows]

    def owned_sessions(self, status: SessionStatus, owner: str) -> list[tuple[SessionRecord, int]]:
        """Every session with this status held by broker node ``owner`` (or by none: a row
        stored before owners were), with its epoch, ordered by URI.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "owned_sessions") as conn:
            rows = conn.execute(
                select(*_COLUMNS, SessionRow.epoch)
                .where(
                    SessionRow.status == str(SessionStatus(status)),
                    SessionRow.owner.in_([owner, ""]),
                )
                .order_by(SessionRow.uri)
            ).all()
        found = []
        for row in rows:
            values: dict[str, Any] = dict(zip(_NAMES, row[:-1], strict=True))
            values["status"] = SessionStatus(values["status"])
            found.append((SessionRecord(**values), int(row[-1])))
        return found


class SessionWrites:
    """The writes of one :meth:`SqlSessionStore.batch`, in its transaction."""

    def __init__(self, store: SqlSessionStore, conn: Connection) -> None:
        self._store = store
        self._conn = conn
        self.cleared_key = False  # an ENDED status cleared a secret (a checkpoint follows)

    def upsert(self, session: SessionRecord, owner: str, held: int | None) -> Held | Lost:
        """:meth:`SqlSessionStore.upsert_session` in this transaction."""
        conn = self._conn
        values: dict[str, Any] = {name: getattr(session, name) for name in _NAMES}
        values["status"] = str(session.status)
        values["owner"] = owner
        if held is not None:
            changed = {k: v for k, v in values.items() if k != "uri"}
            epoch = conn.execute(
                self._store.refresh_statement, {**changed, "w_uri": session.uri, "w_epoch": held}
            ).scalar_one_or_none()
            return holder_of(conn, session.uri) if epoch is None else Held(int(epoch))
        prev = conn.execute(_PREV_OWNER, {"uri": session.uri}).scalar_one_or_none()
        epoch = conn.execute(self._store.claim_statement, {**values, "epoch": 1}).scalar_one()
        return Held(int(epoch), prev or "")

    def set_status(
        self, uri: str, status: SessionStatus, now: float, epoch: int | None
    ) -> SessionRecord | Lost:
        """The status (and ``updated_at = now``; ENDED also clears ``session_key``) of
        ``uri``'s session, by the broker that holds it at ``epoch`` (None: unfenced), in
        this transaction; the updated session, or :class:`Lost` (also when none)."""
        ended = status is SessionStatus.ENDED
        values = {
            "s_uri": uri,
            "s_epoch": epoch,
            "s_status": str(SessionStatus(status)),
            "s_at": now,
        }
        row = self._conn.execute(_SET_STATUS[(epoch is not None, ended)], values).one_or_none()
        if row is None:
            return holder_of(self._conn, uri)
        self.cleared_key = self.cleared_key or ended
        return _record(row)
