"""Declarative base, naming convention and engine factory shared by every store module.

Every model of the project derives from :class:`Base`, so one ``Base.metadata`` describes
the whole schema for Alembic (``mdeci/store/migrations/env.py``) and for ``alembic check``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, create_engine, event
from sqlalchemy.engine import Engine, make_url
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


# Bounds on how long one database call may block: an SQLite lock held by another
# process, an unreachable PostgreSQL, a statement that hangs. A call past them fails with
# StoreError, which the callers already survive (500 + Retry-After, a retried batch).
SQLITE_BUSY_TIMEOUT = 5.0  # seconds
PG_CONNECT_TIMEOUT = 5  # seconds (libpq connect_timeout)
PG_STATEMENT_TIMEOUT_MS = 5000
# A broker stopped (SIGSTOP, a stalled VM) inside a transaction keeps its row locks: the
# server ends such a session after this long idle in its transaction, so another broker's
# takeover of the same users is not held up by the frozen one (which finds its
# connection gone when it runs again: a StoreError, as for any server-side kill).
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 5000


def secure_sqlite_file(database: str) -> None:
    """The database holds digest HA1s and session secrets: its folder is created 0700 and
    the file 0600 (an existing file is narrowed to 0600). SQLite gives its -wal and -shm
    files the mode of the database file."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    with contextlib.suppress(PermissionError):
        os.chmod(path, 0o600)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine; SQLite gets WAL, a busy timeout and enforced foreign keys and a
    private file; PostgreSQL connect and statement timeouts."""
    if url.startswith("sqlite"):
        kwargs.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT})
    elif url.startswith("postgresql"):
        # connect_args replace the URL's own query arguments of the same name: keep the
        # operator's ``options`` (a search_path, say) after ours, so theirs win.
        given = make_url(url).query.get("options", ())
        theirs = " ".join((given,) if isinstance(given, str) else given)
        kwargs.setdefault(
            "connect_args",
            {
                "connect_timeout": PG_CONNECT_TIMEOUT,
                "options": (
                    f"-c statement_timeout={PG_STATEMENT_TIMEOUT_MS} "
                    f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_TIMEOUT_MS} "
                    f"{theirs}"
                ).strip(),
            },
        )
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":
        secure_sqlite_file(engine.url.database or "")

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            # WAL lets readers run beside the writer; synchronous=FULL keeps a commit durable
            # across kill -9 and power loss, which the queue's exactly-once promise needs.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            # A cleared session key leaves no copy in a page's free space; FAST zeroes only
            # what is written anyway (no extra I/O).
            cur.execute("PRAGMA secure_delete=FAST")
            cur.close()

    return engine


def import_all_models() -> None:
    """Import every module that defines models, so ``Base.metadata`` is complete."""
    from importlib import import_module

    for name in (
        "mdeci.store.models",
        "mdeci.store.usage",
        "mdeci.store.calendars",
        "mdeci.store.identity",
    ):
        try:
            import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
