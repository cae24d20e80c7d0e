"""Alembic environment: metadata from mdeci.store, URL from the caller.

The URL comes, in order, from ``config.attributes['url']`` (set by ``mdeci db upgrade``
and the tests), ``-x url=...`` on the alembic command line, or MDECI_DATABASE_URL.
"""

from __future__ import annotations

import os

from alembic import context

from mdeci.store.base import Base, import_all_models, make_engine

config = context.config
# The advisory lock key of a migration run (any constant the database's other users do
# not take: the ASCII of "mdeci").
MIGRATION_LOCK = 0x6D64656369
import_all_models()
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    url = url or os.environ.get("MDECI_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("alembic: no database URL (use -x url=... or MDECI_DATABASE_URL)")
    return str(url)


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    with engine.connect() as conn:
        # render_as_batch: SQLite cannot ALTER most things; batch mode copies the table.
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            if conn.dialect.name == "postgresql":
                # Brokers started together each migrate at start: one at a time, each
                # reading the version the one before it left. (A SQLite file has one
                # broker: docs/operations.md.)
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
