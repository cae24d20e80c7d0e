"""Database failures reach callers as StoreError, never as SQLAlchemy exceptions."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import SQLAlchemyError

from mdeci.errors import MdeciError
from mdeci.store.base import make_engine
from mdeci.store.errors import StoreError
from mdeci.store.repo import BrokerStore


def test_missing_schema_raises_store_error(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    store = BrokerStore(engine)
    try:
        with pytest.raises(StoreError) as info:
            store.queues.publish(
                "sip:p@x", "m", "s", b"", b"", urgent=False, published_at=0.0,
                targets=[("sip:a@x", 1)], max_depth=1, policy="drop-oldest",
            )  # fmt: skip
        assert isinstance(info.value.__cause__, SQLAlchemyError)
        assert isinstance(info.value, MdeciError)
        assert "publish failed" in str(info.value)
        with pytest.raises(StoreError):
            store.users.list_users()
        with pytest.raises(StoreError):
            store.subscriptions.sweep_expired(0.0)
    finally:
        engine.dispose()
