"""Where the broker core writes churn events (docs/protocol.md §8): a small port.

The core only calls :meth:`ChurnSink.emit`; :class:`ChurnLogSink` plugs in the real
:class:`mdeci.churnlog.ChurnLog`, :class:`MemorySink` keeps them for tests. Field names are
those of §8 only (``addr``, ``queue_depth``, ``nseq``, ``latency_ms``, ``reason`` ...), so
any sink can write them without translation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, cast

from mdeci.churnlog import ChurnLog

FieldValue = str | int | float | None
Row = tuple[FieldValue, ...]
"""One event of a batch of rows (:func:`emit_rows`): its uri, then its fields' values."""


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


def fields_emitter(
    sink: ChurnSink,
) -> Callable[[str, str, Mapping[str, FieldValue]], None]:
    """A function emitting an event with its fields as one mapping into ``sink``: its
    ``emit_fields`` if it has one (the broker's own sinks), else a call of ``emit``
    with the fields as keywords. Resolved once, when a chain is built: re-packing the
    keywords at each link of the chain (LoopSink, MetricsSink, OperatorSink,
    ChurnLogSink) costs about a quarter of a churn event."""
    fast = getattr(sink, "emit_fields", None)
    if callable(fast):
        return cast(Callable[[str, str, Mapping[str, FieldValue]], None], fast)

    def slow(event: str, uri: str, fields: Mapping[str, FieldValue]) -> None:
        sink.emit(event, uri, **fields)

    return slow


RowsEmitter = Callable[[str, tuple[str, ...], Sequence[Row]], None]


def rows_emitter(sink: ChurnSink) -> RowsEmitter:
    """A function emitting a batch of events of one name and one set of fields into
    ``sink`` (see :func:`emit_rows`): its ``emit_rows`` if it has one (the broker's own
    sinks), else each event, in order, through :func:`fields_emitter`."""
    fast = getattr(sink, "emit_rows", None)
    if callable(fast):
        return cast(RowsEmitter, fast)
    one = fields_emitter(sink)

    def slow(event: str, keys: tuple[str, ...], rows: Sequence[Row]) -> None:
        for uri, *values in rows:
            one(event, cast(str, uri), dict(zip(keys, values, strict=True)))

    return slow


def emit_rows(sink: ChurnSink, event: str, keys: tuple[str, ...], rows: Sequence[Row]) -> None:
    """Emit events ``event`` into ``sink``, in order, one per row: ``(uri, *values)``,
    the values of the fields ``keys``; nothing when ``rows`` is empty.

    The broker's bursts (a publish's queued notifications, an ack's delivered ones) go
    down the chain as one call per link: the counters move once per batch, the churn
    log writes the rows with one template and one write, and no event has a dict of its
    own (emitted one by one, the two events of each notification cost 13-24 % of the
    broker's CPU).
    """
    if rows:
        fast = getattr(sink, "emit_rows", None)  # the common case, without rows_emitter
        if fast is not None:
            fast(event, keys, rows)
        else:
            rows_emitter(sink)(event, keys, rows)


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
        self.emit_fields(event, uri, fields)

    def emit_fields(self, event: str, uri: str, fields: Mapping[str, FieldValue]) -> None:
        """:meth:`emit` with the fields as one mapping (see :func:`fields_emitter`)."""
        try:
            self._log.add(event, uri, fields)  # None fields are left out
        except Exception:  # ChurnLogError, or TypeError for a field §8 does not have
            self.failures += 1

    def emit_rows(self, event: str, keys: tuple[str, ...], rows: Sequence[Row]) -> None:
        """Events logged together (see :func:`emit_rows`): one write, :meth:`ChurnLog.add_rows`."""
        try:
            self.failures += self._log.add_rows(event, keys, rows)
        except Exception:  # the log is closed, or the write failed: all are lost
            self.failures += len(rows)
