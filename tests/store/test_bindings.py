"""Registrar bindings: the ``BindingStore`` port of ``sip/registrar.py``, in SQL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sqlalchemy.engine import Engine

from mdeci.store.bindings import Binding, SqlBindingStore

AOR = "sip:alice@example.com"


# The port as sip/registrar.py defines it (copied: the store may not import sip/).
@dataclass(frozen=True, slots=True)
class RegistrarBinding:
    aor: str
    contact: str
    expires_at: float
    call_id: str
    cseq: int
    q: float = 1.0
    source: str | None = None


@runtime_checkable
class BindingStore(Protocol):
    def bindings(self, aor: str, now: float) -> list[Binding]: ...
    def put(self, binding: Binding) -> None: ...
    def remove(self, aor: str, contact: str) -> None: ...
    def remove_all(self, aor: str) -> None: ...
    def expire(self, now: float) -> list[Binding]: ...


def _b(contact: str, expires_at: float, **kw: object) -> Binding:
    return Binding(AOR, contact, expires_at, "call-1", 1, **kw)  # type: ignore[arg-type]


def test_is_the_registrar_port_with_the_same_binding_shape(engine: Engine) -> None:
    store: BindingStore = SqlBindingStore(engine)
    assert isinstance(store, BindingStore)
    assert Binding.__slots__ == RegistrarBinding.__slots__
    b = RegistrarBinding(AOR, "<sip:a@10.0.0.1>", 100.0, "c", 2, 0.5, "udp:10.0.0.1:5060")
    store.put(Binding(**{name: getattr(b, name) for name in Binding.__slots__}))
    assert store.bindings(AOR, 0.0)[0].source == "udp:10.0.0.1:5060"


def test_put_inserts_and_replaces_by_aor_and_contact(engine: Engine) -> None:
    store = SqlBindingStore(engine)
    store.put(_b("<sip:a@10.0.0.1:5060>", 100.0))
    store.put(_b("<sip:a@10.0.0.2:5060>", 200.0, q=0.9))
    replaced = Binding(AOR, "<sip:a@10.0.0.1:5060>", 300.0, "call-2", 7, 0.1, "tcp:10.0.0.1:1")
    store.put(replaced)
    assert store.bindings(AOR, 0.0) == [
        _b("<sip:a@10.0.0.2:5060>", 200.0, q=0.9),
        replaced,
    ]
    assert store.bindings("sip:bob@example.com", 0.0) == []


def test_expiry_boundary_expires_at_equal_now_is_expired(engine: Engine) -> None:
    store = SqlBindingStore(engine)
    store.put(_b("<sip:a@1>", 100.0))
    store.put(_b("<sip:a@2>", 150.0))
    assert [b.contact for b in store.bindings(AOR, 99.999)] == ["<sip:a@1>", "<sip:a@2>"]
    assert [b.contact for b in store.bindings(AOR, 100.0)] == ["<sip:a@2>"]
    assert store.expire(99.999) == []
    assert store.expire(100.0) == [_b("<sip:a@1>", 100.0)]
    assert store.expire(100.0) == []
    assert [b.contact for b in store.bindings(AOR, 0.0)] == ["<sip:a@2>"]


def test_remove_and_remove_all(engine: Engine) -> None:
    store = SqlBindingStore(engine)
    for n in range(3):
        store.put(_b(f"<sip:a@{n}>", 100.0))
    other = Binding("sip:bob@example.com", "<sip:b@1>", 100.0, "c", 1)
    store.put(other)
    store.remove(AOR, "<sip:a@1>")
    store.remove(AOR, "<sip:a@unknown>")
    assert [b.contact for b in store.bindings(AOR, 0.0)] == ["<sip:a@0>", "<sip:a@2>"]
    store.remove_all(AOR)
    assert store.bindings(AOR, 0.0) == []
    assert store.bindings(other.aor, 0.0) == [other]
