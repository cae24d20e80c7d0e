"""Fixtures for the broker tests: a migrated store (SQLite file, or PostgreSQL in an
isolated schema when MDECI_TEST_PG_URL is set), a fake clock and an event sink that
tests can await."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from mdeci.broker import Broker, BrokerCoreConfig, ChurnEvent, MemorySink
from mdeci.broker.sink import FieldValue
from mdeci.store.base import make_engine
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionRecord, SessionStatus

# The store tests' migrated-template fixtures (SQLite template file, PostgreSQL schema).
from tests.store.conftest import (  # noqa: F401
    BROKER_TABLES,
    pg_schema_url,
    sqlite_path,
    sqlite_template,
)

T0 = 1_700_000_000.0


class FakeClock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class WaitingSink(MemorySink):
    """A MemorySink whose events can be awaited (no sleeps in tests)."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        super().emit(event, uri, **fields)
        self._changed.set()

    async def wait_for(self, event: str, uri: str | None = None, count: int = 1) -> ChurnEvent:
        """The ``count``-th ``event`` (for ``uri``), once it has been emitted."""
        while True:
            found = [e for e in self.named(event) if uri is None or e.uri == uri]
            if len(found) >= count:
                return found[count - 1]
            self._changed.clear()
            await self._changed.wait()


def _engine(request: pytest.FixtureRequest, kind: str) -> Engine:
    if kind == "sqlite":
        return make_engine(f"sqlite:///{request.getfixturevalue('sqlite_path')}")
    eng = make_engine(request.getfixturevalue("pg_schema_url"))
    with eng.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {', '.join(BROKER_TABLES)} RESTART IDENTITY"))
    return eng


@pytest.fixture
def store(request: pytest.FixtureRequest) -> Iterator[BrokerStore]:
    """A BrokerStore on a fresh migrated SQLite file."""
    eng = _engine(request, "sqlite")
    try:
        yield BrokerStore(eng)
    finally:
        eng.dispose()


@pytest.fixture
def pg_store(request: pytest.FixtureRequest) -> Iterator[BrokerStore]:
    """A BrokerStore on a fresh migrated PostgreSQL schema (skipped unless MDECI_TEST_PG_URL)."""
    eng = _engine(request, "postgresql")
    try:
        yield BrokerStore(eng)
    finally:
        eng.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_store(request: pytest.FixtureRequest) -> Iterator[BrokerStore]:
    """A BrokerStore on SQLite, then on PostgreSQL (skipped unless MDECI_TEST_PG_URL)."""
    eng = _engine(request, request.param)
    try:
        yield BrokerStore(eng)
    finally:
        eng.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sink() -> WaitingSink:
    return WaitingSink()


def make_broker(store: BrokerStore, clock: FakeClock, sink: MemorySink, **config: Any) -> Broker:
    return Broker(store, BrokerCoreConfig(**config), clock, sink)


def add_session(store: BrokerStore, uri: str, now: float = T0) -> None:
    """What the SIP layer stores when an INVITE completes (the broker only flips status)."""
    store.sessions.upsert_session(
        SessionRecord(
            uri=uri,
            call_id=f"call-{uri}",
            local_tag="lt",
            remote_tag="rt",
            remote_target=uri,
            route_set="",
            remote_sdp="v=0",
            media_addr="127.0.0.1:9",
            session_key=b"k" * 32,
            msisdn=None,
            status=SessionStatus.CONNECTED,
            local_cseq=1,
            remote_cseq=1,
            started_at=now,
            updated_at=now,
        )
    )
