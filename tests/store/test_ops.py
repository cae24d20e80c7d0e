"""The readiness probe: it commits a write, so a store that reads but cannot write (or,
on SQLite, whose disk is nearly full) is not ready."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from mdeci.store import ops
from mdeci.store.base import make_engine
from mdeci.store.errors import StorageFull, StoreError
from mdeci.store.identity import StoreMetaRow


def test_the_readiness_probe_commits_a_write(engine: Engine) -> None:
    ops.ping(engine, 1234.5)
    ops.ping(engine, 1240.25)  # the same row again, not a row per probe
    with engine.connect() as conn:
        rows = conn.execute(sa.select(StoreMetaRow.value).where(StoreMetaRow.key == ops.READY_KEY))
        assert [float(v) for v in rows.scalars()] == [1240.25]


def test_a_store_that_reads_but_cannot_write_is_not_ready(sqlite_path: Path) -> None:
    engine = make_engine(f"sqlite:///{sqlite_path}")
    try:
        with engine.begin() as conn:
            for event in ("INSERT", "UPDATE"):
                conn.execute(
                    sa.text(
                        f"CREATE TRIGGER refuse_{event.lower()} BEFORE {event} ON store_meta "
                        "BEGIN SELECT RAISE(ABORT, 'writes refused'); END"
                    )
                )
        with pytest.raises(StoreError, match="writes refused"):
            ops.ping(engine, 1.0)
    finally:
        engine.dispose()


def test_sqlite_with_less_free_space_than_configured_is_not_ready(sqlite_path: Path) -> None:
    engine = make_engine(f"sqlite:///{sqlite_path}")
    try:
        ops.ping(engine, 1.0, min_free=1 << 20)  # a few MB free where the tests run
        with pytest.raises(StorageFull, match=r"store\.min_free_bytes"):
            ops.ping(engine, 1.0, min_free=1 << 62)
    finally:
        engine.dispose()
