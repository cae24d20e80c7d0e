"""Declarative base, naming convention and engine factory shared by every store module.

Every model of the project derives from :class:`Base`, so one ``Base.metadata`` describes
the whole schema for Alembic (``migrations/env.py``) and for ``alembic check``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import MetaData, create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase

# Named constraints make migrations reproducible on SQLite and PostgreSQL alike.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine; SQLite gets WAL, a busy timeout and enforced foreign keys."""
    if url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {"timeout": 30})
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            # WAL lets readers run beside the writer; synchronous=FULL keeps a commit durable
            # across kill -9 and power loss, which the queue's exactly-once promise needs.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

    return engine


def import_all_models() -> None:
    """Import every module that defines models, so ``Base.metadata`` is complete."""
    from importlib import import_module

    for name in ("mdeci.store.models", "mdeci.store.usage"):
        try:
            import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
