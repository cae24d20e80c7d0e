"""Attributes that keep their default on almost every instance (a drop counter, a callback
a server never sets): a broker holds a connection and a peer per session, and a slot for
each such attribute is 8 bytes of every one. :class:`Sparse` keeps those set in the
owner's ``sparse`` table instead, built at the first write."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, cast, overload

V = TypeVar("V")


class HasSparse(Protocol):
    sparse: dict[str, Any] | None


class Sparse(Generic[V]):
    """A class attribute: reads give ``default`` until the instance's value is written."""

    __slots__ = ("default", "name")

    def __init__(self, default: V) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Sparse[V]: ...

    @overload
    def __get__(self, obj: HasSparse, owner: type | None = None) -> V: ...

    def __get__(self, obj: HasSparse | None, owner: type | None = None) -> V | Sparse[V]:
        if obj is None:
            return self
        table = obj.sparse
        return self.default if table is None else cast(V, table.get(self.name, self.default))

    def __set__(self, obj: HasSparse, value: V) -> None:
        if obj.sparse is None:
            obj.sparse = {}
        obj.sparse[self.name] = value
