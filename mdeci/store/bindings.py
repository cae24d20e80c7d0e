"""Registrar bindings (RFC 3261 section 10.3) in SQL, for ``sip.registrar.BindingStore``.

A binding is alive while ``now < expires_at``: at ``now == expires_at`` it has expired,
as a registration with ``Expires: 0`` is gone at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, bindparam, delete, select
from sqlalchemy.engine import Engine

from mdeci.store._sql import reading, transaction, upsert_statement
from mdeci.store.models import BindingRow


@dataclass(frozen=True, slots=True)
class Binding:
    """One contact of one AOR; structurally identical to ``sip.registrar.Binding``."""

    aor: str
    contact: str
    expires_at: float
    call_id: str
    cseq: int
    q: float = 1.0
    source: str | None = None


_COLUMNS = (
    BindingRow.aor,
    BindingRow.contact,
    BindingRow.expires_at,
    BindingRow.call_id,
    BindingRow.cseq,
    BindingRow.q,
    BindingRow.source,
)
_TABLE = cast(Table, BindingRow.__table__)
# Built once: the registrar runs these for every REGISTER.
_ALIVE = (
    select(*_COLUMNS)
    .where(BindingRow.aor == bindparam("aor"), BindingRow.expires_at > bindparam("now"))
    .order_by(BindingRow.q.desc(), BindingRow.contact)
)


class SqlBindingStore:
    """The registrar's location service in SQL; every method is one committed transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._put = upsert_statement(
            engine, _TABLE, ("aor", "contact"), ("expires_at", "call_id", "cseq", "q", "source")
        )

    def bindings(self, aor: str, now: float) -> list[Binding]:
        """The unexpired bindings of ``aor`` (``expires_at > now``), highest q first.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "bindings") as conn:
            rows = conn.execute(_ALIVE, {"aor": aor, "now": now}).all()
        return [Binding(*row) for row in rows]

    def put(self, binding: Binding) -> None:
        """Insert the binding, or replace the one with the same (aor, contact).

        Raises:
            StoreError: the database failed.
        """
        values = {
            "aor": binding.aor,
            "contact": binding.contact,
            "expires_at": binding.expires_at,
            "call_id": binding.call_id,
            "cseq": binding.cseq,
            "q": binding.q,
            "source": binding.source,
        }
        with transaction(self._engine, "put binding") as conn:
            conn.execute(self._put, values)

    def remove(self, aor: str, contact: str) -> None:
        """Delete one binding; nothing happens if it does not exist.

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "remove binding") as conn:
            conn.execute(
                delete(BindingRow).where(BindingRow.aor == aor, BindingRow.contact == contact)
            )

    def remove_all(self, aor: str) -> None:
        """Delete every binding of ``aor`` (``Contact: *`` with ``Expires: 0``).

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "remove_all bindings") as conn:
            conn.execute(delete(BindingRow).where(BindingRow.aor == aor))

    def expire(self, now: float) -> list[Binding]:
        """Delete the bindings with ``expires_at <= now`` and return them (for the log).

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "expire bindings") as conn:
            rows = conn.execute(
                delete(BindingRow).where(BindingRow.expires_at <= now).returning(*_COLUMNS)
            ).all()
        return sorted((Binding(*row) for row in rows), key=lambda b: (b.expires_at, b.aor))
