"""The ECI Session Manager's state, one row per user URI.

A row holds the user's dialog (Call-ID, tags, remote target, route set, CSeqs), the
remote SDP and the media address it gave, the RUDP session key and the optional MSISDN,
and the user's status:

- ``CONNECTED``: the dialog is up and the media address answers;
- ``DISCONNECTED``: the dialog is up but RUDP sends fail (queue; urgent ones go by SMS);
- ``ENDED``: the dialog ended (BYE). The row is kept, so the MSISDN and the last media
  address stay known; the next INVITE replaces it with ``upsert_session``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Engine, Row

from mdeci.store._sql import insert_on_conflict, reading, transaction
from mdeci.store.models import SessionRow


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


_NAMES = tuple(f.name for f in fields(SessionRecord))
_COLUMNS = tuple(getattr(SessionRow, name) for name in _NAMES)


def _record(row: Row[Any]) -> SessionRecord:
    values = row._asdict()
    values["status"] = SessionStatus(values["status"])
    return SessionRecord(**values)


class SqlSessionStore:
    """Sessions in SQL; every method is one committed transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def upsert_session(self, session: SessionRecord) -> None:
        """Store the session of ``session.uri``, replacing any previous one whole.

        Raises:
            StoreError: the database failed.
        """
        values = {name: getattr(session, name) for name in _NAMES}
        values["status"] = str(session.status)
        with transaction(self._engine, "upsert_session") as conn:
            stmt = insert_on_conflict(conn, SessionRow).values(values)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[SessionRow.uri],
                    set_={k: v for k, v in values.items() if k != "uri"},
                )
            )

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
        with transaction(self._engine, "set_status") as conn:
            row = conn.execute(
                update(SessionRow)
                .where(SessionRow.uri == uri)
                .values(
                    status=str(SessionStatus(status)),
                    updated_at=now,
                    # An ended session's secret is of no use to anyone but an attacker
                    # reading the database: cleared (issue 12).
                    **({"session_key": b""} if status is SessionStatus.ENDED else {}),
                )
                .returning(*_COLUMNS)
            ).one_or_none()
        return None if row is None else _record(row)

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
