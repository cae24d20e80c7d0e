"""The core's durable state kept in memory: the :mod:`mdeci.agent.files` Protocols without
a disk, for tests that run the core thousands of times (hypothesis)."""

from __future__ import annotations

from typing import Any

from mdeci.agent.errors import StateError
from mdeci.agent.files import KnownSub, OutgoingPub
from mdeci.sms.dedupe import NseqGate


class MemoryGate:
    def __init__(self) -> None:
        self.gate = NseqGate(0)
        self.store_id: str | None = None
        self.saves = 0

    @property
    def highest(self) -> int:
        return self.gate.highest

    @property
    def per_burst(self) -> bool:
        return self.gate.window > 0

    def save(self) -> None:
        self.saves += 1

    def restart(self, store_id: str, window: int = 0) -> None:
        self.gate = NseqGate(0, window=window)
        self.store_id = store_id


class MemoryInbox:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.archived: list[str] = []
        self.fail = False  # every write raises StateError while set

    def extend(self, records: list[dict[str, Any]]) -> None:
        if self.fail:
            raise StateError("inbox: disk full")
        self.records.extend(records)

    def archive(self, suffix: str) -> str:
        self.archived.append(suffix)
        self.records = []
        return suffix


class MemoryOutbox:
    def __init__(self) -> None:
        self._pending: dict[str, OutgoingPub] = {}
        self.synced: set[str] = set()
        self.fail = False

    def add(self, pub: OutgoingPub, *, sync: bool = True) -> None:
        if self.fail:
            raise StateError("outbox: disk full")
        self._pending[pub.msg_id] = pub
        if sync:
            self.synced.add(pub.msg_id)

    def sync(self) -> None:
        if self.fail:
            raise StateError("outbox: disk full")
        self.synced.update(self._pending)

    def done(self, msg_id: str) -> None:
        self._pending.pop(msg_id, None)

    def pending(self) -> list[OutgoingPub]:
        return list(self._pending.values())


class MemorySubs:
    def __init__(self) -> None:
        self.items: tuple[KnownSub, ...] = ()

    def replace(self, items: tuple[KnownSub, ...]) -> None:
        self.items = items


class MemoryFiles:
    def __init__(self) -> None:
        self.inbox = MemoryInbox()
        self.nseq = MemoryGate()
        self.outbox = MemoryOutbox()
        self.subs = MemorySubs()
