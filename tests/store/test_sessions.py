"""The Session Manager's per-user session rows."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from mdeci.store.base import make_engine
from mdeci.store.sessions import SessionRecord, SessionStatus, SqlSessionStore

ALICE = "sip:alice@example.com"
BOB = "sip:bob@example.com"


def _session(uri: str = ALICE, **kw: object) -> SessionRecord:
    base = SessionRecord(
        uri=uri,
        call_id="c1@host",
        local_tag="lt",
        remote_tag="rt",
        remote_target="<sip:alice@10.0.0.1:5060>",
        route_set="<sip:p1;lr>,<sip:p2;lr>",
        remote_sdp="v=0\r\no=alice 1 1 IN IP4 10.0.0.1\r\n",
        media_addr="10.0.0.1:4000",
        session_key=bytes(range(32)),
        msisdn="+5521999990000",
        status=SessionStatus.CONNECTED,
        local_cseq=1,
        remote_cseq=101,
        started_at=1000.0,
        updated_at=1000.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_upsert_get_and_reinvite_replaces(engine: Engine) -> None:
    store = SqlSessionStore(engine)
    assert store.get_session(ALICE) is None
    first = _session()
    store.upsert_session(first)
    got = store.get_session(ALICE)
    assert got == first
    assert got is not None and isinstance(got.status, SessionStatus)
    moved = replace(
        first,
        remote_target="<sip:alice@10.0.0.9:5060>",
        media_addr="10.0.0.9:4000",
        remote_cseq=102,
        msisdn=None,
        updated_at=1010.5,
    )
    store.upsert_session(moved)
    assert store.get_session(ALICE) == moved


def test_set_status_end_and_query_by_status(engine: Engine) -> None:
    store = SqlSessionStore(engine)
    store.upsert_session(_session())
    store.upsert_session(_session("sip:bob@example.com", call_id="c2"))
    down = store.set_status(ALICE, SessionStatus.DISCONNECTED, 1005.0)
    assert down == _session(status=SessionStatus.DISCONNECTED, updated_at=1005.0)
    assert store.set_status("sip:nobody@x", SessionStatus.CONNECTED, 1.0) is None
    assert [s.uri for s in store.sessions_with_status(SessionStatus.CONNECTED)] == [
        "sip:bob@example.com"
    ]
    assert [s.uri for s in store.sessions_with_status(SessionStatus.DISCONNECTED)] == [ALICE]
    ended = store.end_session(ALICE, 1100.0)
    assert ended is not None and ended.status is SessionStatus.ENDED
    assert ended.updated_at == 1100.0 and ended.msisdn == "+5521999990000"
    assert store.end_session("sip:nobody@x", 1.0) is None
    assert store.sessions_with_status(SessionStatus.DISCONNECTED) == []
    assert [s.uri for s in store.sessions_with_status(SessionStatus.ENDED)] == [ALICE]


def test_unknown_status_is_refused(engine: Engine) -> None:
    store = SqlSessionStore(engine)
    store.upsert_session(_session())
    with pytest.raises(ValueError):
        store.set_status(ALICE, "ASLEEP", 1.0)  # type: ignore[arg-type]
    assert store.get_session(ALICE) == _session()


def test_an_ended_sessions_key_leaves_the_sqlite_files_at_once(sqlite_path: Path) -> None:
    """The key is cleared at ENDED, and no copy stays behind in the write-ahead log (nor
    in the database file) until some later checkpoint: the broker still runs."""
    engine = make_engine(f"sqlite:///{sqlite_path}")
    try:
        store = SqlSessionStore(engine)
        key = os.urandom(32)
        for uri, session_key in ((ALICE, key), (BOB, os.urandom(32))):
            store.upsert_session(_session(uri, session_key=session_key))
        wal = sqlite_path.with_name(sqlite_path.name + "-wal")
        assert key in wal.read_bytes()
        with engine.connect() as conn:  # an earlier checkpoint took it into the file too
            conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        assert key in sqlite_path.read_bytes()
        store.set_status(ALICE, SessionStatus.DISCONNECTED, 1500.0)  # the page in the log
        assert key in wal.read_bytes()
        ended = store.end_session(ALICE, 2000.0)
        assert ended is not None and ended.session_key == b""
        for path in (sqlite_path, wal):
            assert not path.exists() or key not in path.read_bytes(), path.name
        bob = store.get_session(BOB)
        assert bob is not None and bob.session_key  # a live session keeps its key
    finally:
        engine.dispose()
