"""What a peer is told about a store failure, and when the operator log hears of one."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import psycopg.errors
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from mdeci.broker.db_health import DatabaseHealth
from mdeci.broker.refusal import STORAGE_FULL, STORAGE_UNAVAILABLE, refusal
from mdeci.errors import StorageFull, StoreError, StoreUnavailable
from mdeci.store._sql import reading, store_error, transaction
from tests.broker.conftest import FakeClock


def _wrapped(orig: Exception) -> OperationalError:
    return OperationalError("INSERT INTO t VALUES (?)", ("secret",), orig)


def test_a_full_sqlite_database_is_storage_full(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'small.db'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x BLOB)")
    with pytest.raises(StorageFull) as caught, transaction(engine, "fill") as conn:
        conn.exec_driver_sql("PRAGMA max_page_count = 4")
        for _ in range(64):
            conn.exec_driver_sql("INSERT INTO t VALUES (zeroblob(4096))")
    assert "database or disk is full" in str(caught.value)  # the log keeps the details
    engine.dispose()


def test_an_unreachable_postgresql_server_is_storage_unavailable() -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once.
    engine = sa.create_engine(
        "postgresql+psycopg://postgres@127.0.0.1:1/test", connect_args={"connect_timeout": 2}
    )
    with pytest.raises(StoreUnavailable), reading(engine, "read") as conn:
        conn.exec_driver_sql("SELECT 1")
    engine.dispose()


@pytest.mark.parametrize(
    ("orig", "kind"),
    [
        (psycopg.errors.DiskFull("no space"), StorageFull),
        (psycopg.errors.OutOfMemory("no memory"), StorageFull),
        (psycopg.errors.AdminShutdown("terminating"), StoreUnavailable),
        (psycopg.errors.CannotConnectNow("starting up"), StoreUnavailable),
        (psycopg.errors.ConnectionFailure("lost"), StoreUnavailable),
        (psycopg.OperationalError("server closed the connection"), StoreUnavailable),
        (psycopg.errors.UndefinedTable("no table"), StoreError),
    ],
)
def test_a_postgresql_error_is_classified_by_its_sqlstate(
    orig: Exception, kind: type[StoreError]
) -> None:
    error = store_error("publish", _wrapped(orig))
    assert type(error) is kind
    assert str(orig) in str(error)


@pytest.mark.parametrize(
    ("error", "code", "reason"),
    [
        (StoreError("x [SQL: INSERT] sip:bob"), STORAGE_UNAVAILABLE, "storage-unavailable"),
        (StoreUnavailable("127.0.0.1:5432 refused"), STORAGE_UNAVAILABLE, "storage-unavailable"),
        (StorageFull("database or disk is full"), STORAGE_FULL, "storage-full"),
    ],
)
def test_a_refusal_carries_a_stable_code_and_the_public_text_only(
    error: StoreError, code: int, reason: str
) -> None:
    answer = refusal(error)
    assert (answer.code, answer.reason) == (code, reason)
    assert answer.message == f"{reason}: {error.public}"
    assert str(error) not in answer.message


def _events(caplog: pytest.LogCaptureFixture, name: str) -> list[dict[str, object]]:
    return [getattr(r, "mdeci_fields", {}) for r in caplog.records if r.getMessage() == name]


def test_an_outage_is_logged_once_and_its_recovery_with_its_duration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mdeci")
    clock = FakeClock(100.0)
    health = DatabaseHealth(clock)
    health.succeeded()
    assert not _events(caplog, "database_recovered")  # nothing failed: nothing to say
    for _ in range(50):
        health.failed("publish", StoreUnavailable("connection refused"), uri="sip:a@x")
        clock.advance(0.1)
    health.failed("publish", StorageFull("database or disk is full"))
    clock.advance(1.0)
    health.succeeded()
    health.succeeded()
    assert _events(caplog, "database_error") == [
        {"where": "publish", "error": "connection refused", "uri": "sip:a@x"},
        {"where": "publish", "error": "database or disk is full"},
    ]
    assert _events(caplog, "database_recovered") == [{"outage_s": 6.0, "failures": 51}]
    assert not health.failing
    health.failed("sweep", StoreUnavailable("connection refused"))  # a new outage
    assert len(_events(caplog, "database_error")) == 3


def test_a_read_that_works_does_not_end_a_full_disk_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reads go on where writes fail: a scrape between refused publishes is not a
    recovery, and the publishes after it are not a new outage."""
    caplog.set_level(logging.INFO, logger="mdeci")
    health = DatabaseHealth(FakeClock(100.0))
    for _ in range(3):
        health.failed("publish", StorageFull("database or disk is full"))
        health.succeeded(wrote=False)  # a /metrics scrape
        assert health.failing
    assert len(_events(caplog, "database_error")) == 1
    assert not _events(caplog, "database_recovered")
    health.succeeded()  # a publish stored
    assert _events(caplog, "database_recovered") == [{"outage_s": 0.0, "failures": 3}]
    health.failed("publish", StoreUnavailable("connection refused"))
    health.succeeded(wrote=False)  # a read ends an outage of an unreachable database
    assert not health.failing
