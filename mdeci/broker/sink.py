"""Where the broker core writes churn events (docs/protocol.md §8): a small port.

The core only calls :meth:`ChurnSink.emit`; :class:`ChurnLogSink` plugs in the real
:class:`mdeci.churnlog.ChurnLog`, :class:`MemorySink` keeps them for tests. Field names are
those of §8 only (``addr``, ``queue_depth``, ``nseq``, ``latency_ms``, ``reason`` ...), so
any sink can write them without translation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from mdeci.churnlog import ChurnLog

FieldValue = str | int | float | None


class ChurnSink(Protocol):
    """Receives one churn event; must not raise into the broker (log and carry on)."""

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None: ...


@dataclass(frozen=True, slots=True)
class ChurnEvent:
    """One event a :class:`MemorySink` captured."""

    event: str
    uri: str
    fields: Mapping[str, FieldValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))


class MemorySink:
    """Keeps every event in :attr:`events`, in order (for tests and ``mdeci status``)."""

    def __init__(self) -> None:
        self.events: list[ChurnEvent] = []

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        self.events.append(ChurnEvent(event, uri, fields))

    def named(self, event: str) -> list[ChurnEvent]:
        """The captured events called ``event``, in order."""
        return [e for e in self.events if e.event == event]


class NullSink:
    """Discards every event."""

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        pass


class ChurnLogSink:
    """Writes events to a :class:`~mdeci.churnlog.ChurnLog` (one JSON line each).

    A record the log refuses, or a write that fails, is counted in :attr:`failures` and
    dropped: losing a log line must never stop delivery.
    """

    def __init__(self, log: ChurnLog) -> None:
        self._log = log
        self.failures = 0

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        try:
            self._log.append(event, uri, fields)  # None fields are left out
        except Exception:  # ChurnLogError, or TypeError for a field §8 does not have
            self.failures += 1
