"""The registrar's SQLite binding store (``--workers``/``--store``) keeps the
:class:`sip.registrar.BindingStore` contract of the in-memory one, commits a batch as
one transaction, and shares its rows with every connection (worker) on the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from sip.registrar import Binding, BindingStore, MemoryBindingStore
from sip.tools.sqlitestore import SqliteBindingStore

AOR = "sip:alice@example.org"


def binding(contact: str, expires_at: float, cseq: int = 1) -> Binding:
    return Binding(AOR, contact, expires_at, "call-1", cseq, 1.0, "127.0.0.1:5060")


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BindingStore:
    if request.param == "memory":
        return MemoryBindingStore()
    return SqliteBindingStore(tmp_path / "b.db")


def test_the_contract_of_a_binding_store(store: BindingStore) -> None:
    store.put(binding("sip:a@h", 100.0))
    store.put(binding("sip:b@h", 50.0))
    store.put(binding("sip:a@h", 200.0, cseq=2))  # same (aor, contact): replaced
    assert sorted((b.contact, b.expires_at, b.cseq) for b in store.bindings(AOR, 10.0)) == [
        ("sip:a@h", 200.0, 2),
        ("sip:b@h", 50.0, 1),
    ]
    assert [b.contact for b in store.bindings(AOR, 50.0)] == ["sip:a@h"]  # b has expired
    assert [b.contact for b in store.expire(60.0)] == ["sip:b@h"]
    assert store.expire(60.0) == []  # reported once
    store.remove(AOR, "sip:a@h")
    store.remove(AOR, "sip:nothing@h")
    assert store.bindings(AOR, 0.0) == []
    store.put(binding("sip:c@h", 100.0))
    store.remove_all(AOR)
    assert store.bindings(AOR, 0.0) == [] and store.expire(1e9) == []


def test_a_batch_is_one_transaction_seen_by_the_other_workers(tmp_path: Path) -> None:
    one = SqliteBindingStore(tmp_path / "b.db")
    other = SqliteBindingStore(tmp_path / "b.db")
    one.begin()
    one.put(binding("sip:a@h", 100.0))
    one.rollback()
    assert other.bindings(AOR, 0.0) == []
    one.begin()
    one.put(binding("sip:a@h", 100.0))
    one.put(binding("sip:b@h", 100.0))
    one.commit()
    assert sorted(b.contact for b in other.bindings(AOR, 0.0)) == ["sip:a@h", "sip:b@h"]
    other.put(binding("sip:a@h", 300.0, cseq=5))  # outside a batch: committed at once
    assert [b.cseq for b in one.bindings(AOR, 0.0) if b.contact == "sip:a@h"] == [5]
    one.close()
    other.close()
