"""The store's incarnation id: a random id made once per database, read by the broker.

A broker announces it to agents (``a=mdeci-store`` in its SDP answer, docs/agent.md);
an agent that sees a new one knows the queues and their ``nseq`` numbering started over
(a new database, a wiped ``var/``, SQLite replaced by PostgreSQL) and resets its gate
instead of dropping the new store's notifications as duplicates. The id is created on
first read (so a database made by any means gets one), in table ``store_meta``
(migration ``0005a``).
"""

from __future__ import annotations

import secrets

from sqlalchemy import Text, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Mapped, mapped_column

from mdeci.store._sql import insert_on_conflict, reading, transaction
from mdeci.store.base import Base

INCARNATION_KEY = "incarnation"


class StoreMetaRow(Base):
    """One named value about the store itself."""

    __tablename__ = "store_meta"

    key: Mapped[str] = mapped_column(Text, primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class SqlStoreIdentity:
    """Reads (and on first use creates) the incarnation id."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def incarnation(self) -> str:
        """The id. Raises :class:`~mdeci.store.errors.StoreError`."""
        query = select(StoreMetaRow.value).where(StoreMetaRow.key == INCARNATION_KEY)
        with reading(self.engine, "read the store incarnation") as conn:
            found = conn.execute(query).scalar_one_or_none()
        if found is not None:
            return str(found)
        with transaction(self.engine, "create the store incarnation") as conn:
            stmt = insert_on_conflict(conn, StoreMetaRow).values(
                key=INCARNATION_KEY, value=secrets.token_hex(8)
            )
            conn.execute(stmt.on_conflict_do_nothing(index_elements=["key"]))
            return str(conn.execute(query).scalar_one())
