"""The session churn log of docs/protocol.md §8: one JSON object per line, rotated by size.

Both the broker and the agent write one; the analytics jobs read them. Each record has
``ts`` (RFC 3339 UTC with milliseconds), ``node``, ``role`` (``broker`` or ``agent``: who
wrote it), ``event`` and ``uri``, then only the optional fields that have a value, in the
order of §8. Both sides log some of the same facts (a delivery, a re-INVITE); for each
event :data:`AUTHORITY` names the role whose line is the fact, so that the analytics count
it once (docs/analytics.md, "One source of truth per event"). Each line reaches the operating
system with one ``write`` as soon as it is logged (the file is unbuffered), so a
``kill -9`` loses at most the line being written; the analytics set aside a torn last
line as an invalid record. Records logged together in one call (:meth:`ChurnLog.add_rows`:
a publish's queued notifications, an ack's delivered ones) are one ``write``, made before
the call returns; a ``defer`` log writes once per loop turn (see :class:`ChurnLog`).

Two encoders write the same bytes: the general one (:func:`record_of`, then the JSON
encoder; :meth:`ChurnLog.write` and :meth:`ChurnLog.append`, which return the record)
and a fast one for the broker (:meth:`ChurnLog.add`, :meth:`ChurnLog.add_rows`), which
builds the text of a record whose values have exactly their §8 types without a dict,
and hands anything else to the general one, which decides (two lines per notification
would otherwise be a fifth of the broker's CPU). tests/mdeci/test_churnlog.py checks
that they agree, byte for byte and refusal for refusal, for any values.

The clock is injected (epoch seconds), so tests and replays control ``ts``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Final, TypedDict, Unpack, cast

from mdeci import oplog
from mdeci.errors import ChurnLogError


class Event(StrEnum):
    """The event names of docs/protocol.md §8, exactly: the one list of them.

    The analytics read this class, :data:`AGENT_EVENTS` and :class:`ChurnFields` from
    this file's text (analytics/vocabulary.py; they import nothing of mdeci), so these
    three stay plain literals.
    """

    REGISTERED = "registered"
    UNREGISTERED = "unregistered"
    REGISTRATION_EXPIRED = "registration_expired"
    SESSION_STARTED = "session_started"
    SESSION_REINVITED = "session_reinvited"
    SESSION_ENDED = "session_ended"
    IP_CHANGED = "ip_changed"
    MEDIA_CONNECTED = "media_connected"
    MEDIA_DISCONNECTED = "media_disconnected"
    BROKER_LOST = "broker_lost"
    NOTIFY_QUEUED = "notify_queued"
    NOTIFY_DELIVERED = "notify_delivered"
    NOTIFY_DROPPED = "notify_dropped"
    SMS_SENT = "sms_sent"
    SMS_RECEIVED = "sms_received"
    SUBSCRIPTION_ADDED = "subscription_added"
    SUBSCRIPTION_REMOVED = "subscription_removed"
    SUBSCRIPTION_EXPIRED = "subscription_expired"
    NOTIFY_DUPLICATE = "notify_duplicate"
    NOTIFY_GAP = "notify_gap"
    HANDOFF = "handoff"
    CHANNEL_DECIDED = "channel_decided"
    PUBLISH_DECIDED = "publish_decided"


class Role(StrEnum):
    """Who wrote a line: the broker or a device's agent."""

    BROKER = "broker"
    AGENT = "agent"


# Which role's line is the fact for each event. The broker holds the registrar, the
# dialogs, the queues and the acks, so it is authoritative for everything it sees; only a
# device knows its own address changed, that its broker went silent (a killed broker
# logs nothing), and which notifications its gate refused as duplicates or found
# missing. The agent's media_connected also carries the restore latency it measured
# (move or outage start -> media up): the jobs take that figure from the agent's line
# and the connection state from the broker's.
AGENT_EVENTS: Final = (
    Event.IP_CHANGED,
    Event.BROKER_LOST,
    Event.NOTIFY_DUPLICATE,
    Event.NOTIFY_GAP,
    Event.PUBLISH_DECIDED,
)
AUTHORITY: Final[dict[Event, Role]] = {
    event: Role.AGENT if event in AGENT_EVENTS else Role.BROKER for event in Event
}

CHANNELS: Final = frozenset({"ip", "sms"})
DEFAULT_MAX_BYTES: Final = 10 * 1024 * 1024
DEFAULT_BACKUPS: Final = 5


def format_ts(epoch: float) -> str:
    """``2026-11-22T21:05:03.123Z``: RFC 3339, UTC, milliseconds truncated (never rounded
    up into the next second).

    Raises :class:`ChurnLogError` for a time that is not finite or out of range.
    """
    if not math.isfinite(epoch):
        raise ChurnLogError(f"clock gave a non-finite time {epoch!r}")
    millis = math.floor(epoch * 1000)
    try:
        second = _second_text(millis // 1000)
    except (OverflowError, OSError, ValueError) as exc:
        raise ChurnLogError(f"clock gave an out-of-range time {epoch!r}") from exc
    return f"{second}.{millis % 1000:03d}Z"


@functools.lru_cache(maxsize=4)
def _second_text(second: int) -> str:
    # A busy log writes many lines per second: format each second once.
    return f"{datetime.fromtimestamp(second, UTC):%Y-%m-%dT%H:%M:%S}"


def _role(role: object) -> Role:
    try:
        return Role(str(role))
    except ValueError:
        text = repr(role)[:40]
        raise ChurnLogError(f"churn log role must be 'broker' or 'agent', not {text}") from None


def _check(name: str, value: object, kind: type | tuple[type, ...]) -> None:
    # bool is an int subclass; a count or a cost is never a boolean.
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ChurnLogError(f"churn log field {name!r} has type {type(value).__name__}")


class ChurnFields(TypedDict, total=False):
    """The optional fields of a record (docs/protocol.md §8), as keyword arguments."""

    call_id: str | None
    addr: str | None
    prev_addr: str | None
    channel: str | None
    queue_depth: int | None
    nseq: int | None
    latency_ms: float | None
    bytes: int | None
    cost: float | None
    reason: str | None
    missed: int | None
    published: str | None
    prev_node: str | None


# Field order of a record (§8); the writer emits them in this order, omitting None.
OPTIONAL_FIELDS: Final[tuple[str, ...]] = tuple(ChurnFields.__annotations__)
FIELDS: Final[tuple[str, ...]] = ("ts", "node", "role", "event", "uri", *OPTIONAL_FIELDS)
_OPTIONAL: Final = frozenset(OPTIONAL_FIELDS)


_EVENTS: Final[dict[str, Event]] = {event.value: event for event in Event}
_COUNTS: Final = frozenset({"queue_depth", "nseq", "bytes", "missed"})
_NUMBERS: Final = frozenset({"latency_ms", "cost"})
# One encoder for every line: json.dumps with options builds a new one per call, a visible
# share of a broker's CPU per notification (two lines each).
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# The fast encoder of fixed-shape records (ChurnLog.add/add_many): a line built as text
# straight from the fields, without the record dict and the general encoder; byte for byte
# the line of the general path (tests/mdeci/test_churnlog.py checks it for any values).
# The text escaper is the one JSONEncoder(ensure_ascii=False) uses.
_encode_text: Final[Callable[[str], str]] = json.encoder.encode_basestring
_COUNT, _NUMBER, _TEXT, _CHANNEL = range(4)
_Plan = tuple[tuple[str, int, str], ...]


@functools.lru_cache(maxsize=256)
def _plan(keys: tuple[str, ...]) -> _Plan | None:
    """How to write a call's fields (``keys`` as given): each §8 field in §8 order with
    its kind and its ``,"name":`` text; None when a key is not in §8 (the general path
    decides then)."""
    if any(key not in _OPTIONAL for key in keys):
        return None
    plan = []
    for key in OPTIONAL_FIELDS:
        if key in keys:
            if key in _COUNTS:
                kind = _COUNT
            elif key in _NUMBERS:
                kind = _NUMBER
            else:
                kind = _CHANNEL if key == "channel" else _TEXT
            plan.append((key, kind, f',"{key}":'))
    return tuple(plan)


RowEncoder = Callable[
    [
        str,
        Iterable[tuple[object, ...]],
        list[bytes],
        Callable[[float, str, tuple[str, ...], tuple[object, ...], list[bytes]], int],
        float,
        str,
        tuple[str, ...],
    ],
    int,
]


@functools.lru_cache(maxsize=64)
def _row_encoder(keys: tuple[str, ...]) -> RowEncoder | None:
    """The fast encoder of rows ``(uri, *values of keys)`` (:meth:`ChurnLog.add_rows`):
    a function written for this set of fields, so that a row costs one unpacking, one
    type test per value and one f-string, not a loop over its fields (the broker logs
    two lines per notification). It appends the lines of rows whose values
    all have exactly their §8 types (no None) to ``lines`` and hands any other row to
    ``slow`` (the general path, which omits None fields and refuses what is invalid), in
    row order; returns what ``slow`` counted as refused. None unless ``keys`` are
    distinct §8 fields (rows of any other shape go the general way)."""
    plan = _plan(keys)
    if plan is None or len(set(keys)) != len(keys):
        return None
    names = [f"v{i}" for i in range(len(keys) + 1)]
    checks = ["type(v0) is str"]
    text = "{start}{_enc(v0)}"
    for key, kind, name in plan:
        assert key.isidentifier() and "{" not in name and "'" not in name  # §8 names only
        v = names[keys.index(key) + 1]
        if kind == _COUNT:
            checks.append(f"type({v}) is int")
            text += f"{name}{{{v}!r}}"
        elif kind == _NUMBER:
            checks.append(f"type({v}) is float and _isfinite({v})")
            text += f"{name}{{{v}!r}}"
        else:
            checks.append(f"type({v}) is str")
            if kind == _CHANNEL:
                checks.append(f"{v} in _CHANNELS")
            text += f"{name}{{_enc({v})}}"
    source = f"""
def encode(start, rows, lines, slow, epoch, event, keys):
    refused = 0
    for row in rows:
        if len(row) == {len(names)}:
            {", ".join(names)}, = row
            if {" and ".join(checks)}:
                try:
                    lines.append(f'{text}}}}}\\n'.encode())
                    continue
                except UnicodeEncodeError:
                    pass  # a lone surrogate: the general path refuses it
        refused += slow(epoch, event, keys, row, lines)
    return refused
"""
    namespace: dict[str, Any] = {
        "_enc": _encode_text,
        "_isfinite": math.isfinite,
        "_CHANNELS": CHANNELS,
    }
    # The source is built above from §8 names only; its name shows in tracebacks/profiles.
    exec(compile(source, f"<churnlog row encoder {','.join(keys)}>", "exec"), namespace)
    return cast(RowEncoder, namespace["encode"])


@functools.lru_cache(maxsize=256)
def _in_order(keys: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``keys`` (a call's field names, as given): the §8 ones in §8 order, and the
    others. Cached: a program calls with a handful of field sets, and sorting them per
    line cost a visible share of a line."""
    return (
        tuple(key for key in OPTIONAL_FIELDS if key in keys),
        tuple(sorted(key for key in keys if key not in _OPTIONAL)),
    )


def make_record(
    epoch: float,
    node: str,
    event: Event | str,
    *,
    uri: str,
    role: Role | None = None,
    **fields: Unpack[ChurnFields],
) -> dict[str, Any]:
    """Build one record (a dict in §8 field order, None fields left out; ``role`` too).

    Raises :class:`ChurnLogError` for an unknown event, an unknown channel, or a field of
    the wrong type (ints for counts, numbers for ``latency_ms`` and ``cost``, text else).
    """
    return record_of(epoch, node, event, uri, role, fields)


def record_of(
    epoch: float,
    node: str,
    event: Event | str,
    uri: str,
    role: Role | None,
    fields: Mapping[str, object],
) -> dict[str, Any]:
    """:func:`make_record` with the optional fields as one mapping (no keyword packing:
    a broker builds two records per notification). A field that is not in §8 is refused
    unless its value is None (left out like any None field)."""
    name = _EVENTS.get(event) if isinstance(event, str) else None
    if name is None:
        raise ChurnLogError(f"unknown churn event {str(event)[:40]!r}")
    record: dict[str, Any] = {"ts": format_ts(epoch), "node": node}
    if role is not None:
        record["role"] = role.value if isinstance(role, Role) else _role(role).value
    record["event"] = name.value
    if uri is not None:
        _check("uri", uri, str)
        record["uri"] = uri
    if not fields:
        return record
    known, unknown = _in_order(tuple(fields))
    for key in unknown:
        if fields[key] is not None:
            raise ChurnLogError(f"unknown churn log field {key[:40]!r}")
    for key in known:
        value: Any = fields[key]
        if value is None:
            continue
        if key in _COUNTS:
            _check(key, value, int)
        elif key in _NUMBERS:
            _check(key, value, (int, float))
            if not math.isfinite(value):
                raise ChurnLogError(f"churn log field {key!r} is not finite")
            value = float(value)
        else:
            _check(key, value, str)
        record[key] = value
    channel = fields.get("channel")
    if channel is not None and channel not in CHANNELS:
        text = str(channel)[:20]
        raise ChurnLogError(f"churn log channel must be 'ip' or 'sms', not {text!r}")
    return record


def _encoded(record: Mapping[str, Any]) -> bytes:
    """One line of the general path: ``record`` as compact JSON, UTF-8, newline."""
    try:
        return (_ENCODER.encode(record) + "\n").encode("utf-8")
    except (ValueError, UnicodeEncodeError) as exc:
        raise ChurnLogError(f"churn log record is not valid UTF-8 JSON: {exc}") from exc


class ChurnLog:
    """Appends churn records to ``path``, rotating to ``path.1`` .. ``path.<backups>``.

    A file is rotated before a line that would take it past ``max_bytes`` (a single line
    larger than that still goes, alone, into a fresh file). ``backups == 0`` keeps no old
    files. The parent folder is created if needed. ``role`` (who writes: broker or agent)
    goes into every line. ``private``: each file is 0600 whatever the umask (an agent's
    log holds its user's addresses and moves).

    ``defer`` (e.g. an event loop's ``call_soon``): lines are kept and written together
    by :meth:`flush`, which the first line of a burst schedules with it; one ``write``
    per burst instead of one per line (a broker logs two lines per notification). A
    ``kill -9`` then loses the lines of the burst being logged (one loop turn), not only
    the line being written; a failed deferred write is reported once
    (``churnlog_error``) and counted in :attr:`write_failures`.

    Raises :class:`ChurnLogError` if the file cannot be opened or written.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        node: str,
        clock: Callable[[], float],
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
        *,
        role: Role | None = None,
        defer: Callable[[Callable[[], None]], object] | None = None,
        private: bool = False,
    ) -> None:
        if not isinstance(node, str) or not node:
            raise ChurnLogError("churn log node name must be non-empty text")
        if max_bytes < 1 or backups < 0:
            raise ChurnLogError("churn log needs max_bytes >= 1 and backups >= 0")
        self.path = Path(path)
        self.node = node
        self.role = None if role is None else _role(role)
        self.max_bytes = max_bytes
        self.backups = backups
        self._clock = clock
        self._file: BinaryIO | None = None
        self._size = 0
        self._closed = False  # by close(): only then do writes stop for good
        self._failing = False  # a rotation or reopen failed; logged once until it works
        self.rotation_failures = 0
        self._defer = defer
        self._private = private  # files 0600 whatever the umask (an agent's log)
        self._unwritten: list[bytes] = []  # lines kept for flush (only with ``defer``)
        self.write_failures = 0  # deferred writes that failed (their lines are lost)
        # The fast encoder's constant text per event: what comes between ts and uri.
        role_text = "" if self.role is None else f',"role":"{self.role.value}"'
        self._heads: dict[str, str] = {
            event.value: f'","node":{_encode_text(node)}{role_text},"event":"{event.value}","uri":'
            for event in Event
        }
        # The last millisecond stamped and its text (a burst shares its ms: one format).
        self._stamp_millis: int | None = None
        self._stamp_text = ""
        self._open()

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # buffering=0: every write() goes straight to the OS (one syscall per line).
            self._file = open(self.path, "ab", buffering=0, opener=self._opener)  # noqa: SIM115
            self._size = os.fstat(self._file.fileno()).st_size
        except OSError as exc:
            raise ChurnLogError(f"cannot open churn log {self.path}: {exc.strerror}") from exc

    def _opener(self, path: str, flags: int) -> int:
        fd = os.open(path, flags, 0o600 if self._private else 0o666)
        if self._private:
            os.fchmod(fd, 0o600)
        return fd

    def _rotate(self) -> None:
        """Shift ``path`` -> ``path.1`` -> ... and start a fresh file.

        A rename that fails (a read-only folder, a full disk, something in the way) must
        not close the log for good: the current file is reopened and keeps growing past
        ``max_bytes``, the failure is logged once (``churnlog_error``) and counted in
        :attr:`rotation_failures`, and the next write tries again.
        """
        assert self._file is not None
        self._file.close()
        self._file = None
        try:
            if self.backups == 0:
                self.path.unlink(missing_ok=True)
            else:
                for n in range(self.backups - 1, 0, -1):
                    older = self.path.with_name(f"{self.path.name}.{n}")
                    if older.exists():
                        older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
                self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        except OSError as exc:
            self.rotation_failures += 1
            self._report(f"cannot rotate: {exc.strerror or exc}")
        self._open()

    def _report(self, error: str) -> None:
        if not self._failing:
            self._failing = True
            oplog.event(
                "churnlog_error",
                logger="churnlog",
                level=logging.WARNING,
                path=str(self.path),
                error=error,
            )

    def write(
        self, event: Event | str, *, uri: str, **fields: Unpack[ChurnFields]
    ) -> dict[str, Any]:
        """Append one record stamped with the clock's time; returns the record written.

        Raises :class:`ChurnLogError` for an invalid record (see :func:`make_record`),
        after :meth:`close`, or when the file cannot be written.
        """
        return self.append(event, uri, fields)

    def append(self, event: Event | str, uri: str, fields: Mapping[str, object]) -> dict[str, Any]:
        """:meth:`write` with the optional fields as one mapping (see :func:`record_of`)."""
        self._ready()
        record = record_of(self._clock(), self.node, event, uri, self.role, fields)
        self._log([_encoded(record)])
        return record

    def add(self, event: Event | str, uri: str, fields: Mapping[str, object]) -> None:
        """:meth:`append` without the record: the line is built as text by the fast
        encoder (no record dict; the broker logs two lines per notification),
        the very bytes :meth:`append` would write. Raises as :meth:`append` does."""
        self._ready()
        self._log([self._line(self._clock(), event, uri, fields)])

    def add_rows(
        self, event: Event | str, keys: tuple[str, ...], rows: Iterable[tuple[object, ...]]
    ) -> int:
        """Append records of one event logged together (a publish's queued notifications,
        an ack's delivered ones), one per row ``(uri, *values of keys)``, in order, as
        :meth:`add` would one by one, with one clock read and one write (or one kept
        burst, with ``defer``) for them all. A record the log refuses (see
        :func:`record_of`) is left out; returns how many were.

        Raises :class:`ChurnLogError` after :meth:`close` or when the file cannot be
        written (then none of these lines is known to be written).
        """
        self._ready()
        epoch = self._clock()
        lines: list[bytes] = []
        head = self._heads.get(event) if isinstance(event, str) else None
        encode = _row_encoder(keys)
        if head is not None and encode is not None:
            # The fast encoder, the constant text once for the batch.
            start = '{"ts":"' + self._stamp(epoch) + head
            refused = encode(start, rows, lines, self._row_slow, epoch, event, keys)
        else:
            refused = 0
            for row in rows:
                refused += self._row_slow(epoch, event, keys, row, lines)
        if lines:
            self._log(lines)
        return refused

    def _row_slow(
        self,
        epoch: float,
        event: Event | str,
        keys: tuple[str, ...],
        row: tuple[object, ...],
        lines: list[bytes],
    ) -> int:
        """The general path for one row: appends its line to ``lines`` and returns 0, or
        returns 1 for a record the log refuses."""
        try:
            lines.append(self._row_line(epoch, event, keys, row))
        except Exception:  # ChurnLogError, or a value record_of cannot even check
            return 1
        return 0

    def _row_line(
        self, epoch: float, event: Event | str, keys: tuple[str, ...], row: tuple[object, ...]
    ) -> bytes:
        """The line of one row the fast encoder left to the general path."""
        if len(row) != len(keys) + 1:
            raise ChurnLogError(f"churn log row has {len(row) - 1} values for {len(keys)} fields")
        uri = cast(str, row[0])  # record_of checks it
        fields = dict(zip(keys, row[1:], strict=True))
        return _encoded(record_of(epoch, self.node, event, uri, self.role, fields))

    def _ready(self) -> None:
        if self._closed:
            raise ChurnLogError(f"churn log {self.path} is closed")
        if self._file is None:
            # The last open failed (after a rotation, say): try again for this line.
            try:
                self._open()
            except ChurnLogError as exc:
                self._report(str(exc))
                raise

    def _log(self, lines: list[bytes]) -> None:
        """Keep ``lines`` for :meth:`flush` (``defer``), or write them now."""
        if self._defer is not None:
            if not self._unwritten:
                self._defer(self.flush)
            self._unwritten += lines
        elif len(lines) == 1:
            self._write(lines[0])
        else:
            self._write_lines(lines)

    def _stamp(self, epoch: float) -> str:
        """:func:`format_ts`, formatted once per millisecond."""
        try:
            millis = math.floor(epoch * 1000)
        except (OverflowError, ValueError, TypeError):
            return format_ts(epoch)  # raises the error the general path raises
        if millis != self._stamp_millis:
            self._stamp_text = format_ts(epoch)
            self._stamp_millis = millis
        return self._stamp_text

    def _line(
        self, epoch: float, event: Event | str, uri: str, fields: Mapping[str, object]
    ) -> bytes:
        """The line of one record. The fast encoder writes the common case (a §8 event,
        text uri, fields of exactly their §8 types); anything else, valid or not, goes
        the general way (:func:`record_of`, the JSON encoder), which decides and raises."""
        head = self._heads.get(event) if isinstance(event, str) else None
        plan = _plan(tuple(fields)) if fields else ()
        if head is None or plan is None or type(uri) is not str:
            return _encoded(record_of(epoch, self.node, event, uri, self.role, fields))
        parts = ['{"ts":"', self._stamp(epoch), head, _encode_text(uri)]
        for key, kind, name in plan:
            value = fields[key]
            if value is None:
                continue
            if kind == _COUNT:
                if type(value) is not int:
                    break
                text = repr(value)
            elif kind == _NUMBER:
                if type(value) is not float or not math.isfinite(value):
                    break
                text = repr(value)
            elif kind == _TEXT:
                if type(value) is not str:
                    break
                text = _encode_text(value)
            else:  # channel
                if type(value) is not str or value not in CHANNELS:
                    break
                text = _encode_text(value)
            parts += (name, text)
        else:
            parts.append("}\n")
            try:
                return "".join(parts).encode("utf-8")
            except UnicodeEncodeError:
                pass  # a lone surrogate: the general path refuses it
        return _encoded(record_of(epoch, self.node, event, uri, self.role, fields))

    def flush(self) -> None:
        """Write the lines kept by a ``defer`` log (a no-op otherwise); a failure is
        reported and counted, never raised (the caller is a loop callback)."""
        lines, self._unwritten = self._unwritten, []
        try:
            self._write_lines(lines)
        except ChurnLogError as exc:
            self.write_failures += 1
            self._report(str(exc))

    def _write_lines(self, lines: list[bytes]) -> None:
        """Write whole lines with the rotation rule of :meth:`_write` applied line by
        line: one write per stretch between rotations."""
        chunk: list[bytes] = []
        if self._file is None:
            self._open()  # the last open failed: try again
        size = self._size
        for line in lines:
            if size > 0 and size + len(line) > self.max_bytes:
                if chunk:
                    self._write(b"".join(chunk))
                    chunk = []
                self._rotate()
                size = self._size
            chunk.append(line)
            size += len(line)
        if chunk:
            self._write(b"".join(chunk))

    def _write(self, data: bytes) -> None:
        """Append ``data`` (whole lines), rotating first if it would pass ``max_bytes``."""
        if self._file is None:
            self._open()  # the last open failed: try again (raises ChurnLogError)
        if self._size > 0 and self._size + len(data) > self.max_bytes:
            self._rotate()
        assert self._file is not None
        try:
            view = memoryview(data)
            while view:  # an unbuffered write may be partial; finish the line
                written = self._file.write(view)
                if not written:
                    raise OSError(0, "no progress writing")
                view = view[written:]
        except OSError as exc:
            # A write cut short (a full disk) leaves part of a line; the next line would be
            # glued to it. Cut the file back to its last whole line.
            with contextlib.suppress(OSError):
                os.ftruncate(self._file.fileno(), self._size)
            raise ChurnLogError(f"cannot write churn log {self.path}: {exc.strerror}") from exc
        self._size += len(data)
        if self._failing and self._size <= self.max_bytes:
            self._failing = False  # rotated (or reopened) since: report the next failure

    def close(self) -> None:
        """Write what is kept, close the file; further writes raise
        :class:`ChurnLogError`. Idempotent."""
        if not self._closed and self._unwritten:
            self.flush()
        self._closed = True
        if self._file is not None:
            self._file.close()
            self._file = None

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> ChurnLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
