"""Operator logs: one line per event an operator acts on, through stdlib :mod:`logging`.

Theory of operation
-------------------
The churn log (docs/protocol.md §8) is for analytics; this module is for the person on call.
Every line is one *event* with a fixed name and flat fields, written by
:func:`event` on the ``mdeci`` logger tree, and formatted by :func:`setup` as either
``key=value`` pairs (the default; journald and grep friendly) or one JSON object::

    ts=2026-11-23T20:16:34.123Z level=info logger=mdeci.broker event=session_up
    uri=sip:alice@localhost addr=127.0.0.1:40000          (one line in the file)

The broker's events (docs/operations.md "Logs") are ``session_up``, ``session_down``,
``moved``, ``disconnected``, ``auth_failed`` (with ``source``), ``queue_overflow``,
``notify_dropped``, ``sms_sent``, ``sms_failed`` and ``database_error``. Most are facts the
broker already decides and writes to its churn sink; :class:`OperatorSink` sits in front
of that sink and turns those into log lines, so the two logs cannot disagree. The rest
are written where they are decided (authentication in the SIP endpoint, database errors
where a :class:`~mdeci.errors.StoreError` is answered).

Secrets never reach a line: a field whose name looks like a secret (password, HA1, key,
secret, token) is refused by :func:`event` (a programming error, caught by the tests).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from logging.handlers import WatchedFileHandler
from pathlib import Path
from typing import Any, Literal, Protocol, cast

LogFormat = Literal["kv", "json"]
FORMATS: tuple[LogFormat, ...] = ("kv", "json")
LEVELS = ("debug", "info", "warning", "error")
ROOT = "mdeci"
SECRET = re.compile(r"pass|ha1|key|secret|token|nonce|response", re.IGNORECASE)
_FIELDS = "mdeci_fields"
_SAFE = re.compile(r"[^\s\"=\\]+")

FieldValue = str | int | float | bool | None

# Until a daemon calls setup(), the lines go nowhere (not to logging's last-resort stderr
# handler): an embedding program (the demo, the tests) decides where its logs go.
logging.getLogger(ROOT).addHandler(logging.NullHandler())


def event(
    name: str, *, logger: str = "broker", level: int = logging.INFO, **fields: FieldValue
) -> None:
    """Write one operator event on ``mdeci.<logger>``. Fields that are None are left out.

    Raises ValueError for a field name that looks like a secret.
    """
    for key in fields:
        if SECRET.search(key):
            raise ValueError(f"operator log field {key!r} looks like a secret")
    log = logging.getLogger(f"{ROOT}.{logger}")
    if log.isEnabledFor(level):
        values = {k: v for k, v in fields.items() if v is not None}
        log.log(level, name, extra={_FIELDS: values})


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    value = getattr(record, _FIELDS, None)
    return value if isinstance(value, dict) else {}


def _ts(created: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        + f".{int(created % 1 * 1000):03d}Z"
    )


def _kv(value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if text and _SAFE.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=False)


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... event=... k=v ...`` on one line (values quoted when
    they hold spaces, quotes or ``=``)."""

    def format(self, record: logging.LogRecord) -> str:
        head = {
            "ts": _ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        parts = [f"{k}={_kv(v)}" for k, v in {**head, **_fields(record)}.items()]
        if record.exc_info:
            parts.append(f"exc={_kv(self.formatException(record.exc_info).splitlines()[-1])}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, the same keys as :class:`KeyValueFormatter`."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": _ts(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(obj, ensure_ascii=False, default=str)


def setup(level: str = "info", fmt: LogFormat = "kv", file: Path | None = None) -> logging.Handler:
    """Send the ``mdeci`` loggers (and warnings of the libraries) to stderr or ``file``.

    A file is reopened when logrotate moves it (:class:`WatchedFileHandler`). Returns
    the handler (tests remove it). Raises OSError when the file cannot be opened.
    """
    handler: logging.Handler
    if file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = WatchedFileHandler(file, encoding="utf-8")
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == ROOT:  # set up again (tests): replace, do not duplicate
            root.removeHandler(old)
            old.close()
    handler.set_name(ROOT)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # libraries: warnings and errors only
    logging.getLogger(ROOT).setLevel(level.upper())
    return handler


class _ChurnSink(Protocol):
    def emit(self, event: str, uri: str, **fields: FieldValue) -> None: ...


# The churn events OperatorSink turns into operator lines (the others it only forwards).
_OPERATOR_EVENTS = frozenset(
    {
        "session_started",
        "session_reinvited",
        "session_ended",
        "media_disconnected",
        "notify_dropped",
        "sms_sent",
    }
)


class OperatorSink:
    """A churn sink in front of another: forwards every event, and writes the operator
    events among them as log lines (see the module docstring)."""

    def __init__(self, inner: _ChurnSink) -> None:
        self.inner = inner
        fast = getattr(inner, "emit_fields", None)
        # The inner sink's mapping entry point when it has one (the broker's own sinks),
        # so no event's fields are re-packed as keywords; else its ``emit``.
        self._inner_fields: Callable[[str, str, Mapping[str, FieldValue]], None] = (
            fast if callable(fast) else self._inner_emit
        )
        rows = getattr(inner, "emit_rows", None)
        self._inner_rows: (
            Callable[[str, tuple[str, ...], Sequence[tuple[FieldValue, ...]]], None] | None
        ) = rows if callable(rows) else None

    def _inner_emit(self, event: str, uri: str, fields: Mapping[str, FieldValue]) -> None:
        self.inner.emit(event, uri, **fields)

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        self.emit_fields(event, uri, fields)

    def emit_fields(self, event: str, uri: str, fields: Mapping[str, FieldValue]) -> None:
        """:meth:`emit` with the fields as one mapping."""
        self._inner_fields(event, uri, fields)
        if event in _OPERATOR_EVENTS:
            try:
                self._operator(event, uri, fields)
            except Exception:  # a log line must never stop delivery
                logging.getLogger(ROOT).debug("operator log failed", exc_info=True)

    def emit_rows(
        self, event: str, keys: tuple[str, ...], rows: Sequence[tuple[FieldValue, ...]]
    ) -> None:
        """Events handed over together, one per row ``(uri, *values of keys)`` (see
        ``mdeci.broker.sink.emit_rows``): forwarded as one batch when the inner sink
        takes one, then the operator lines among them, in order."""
        if self._inner_rows is not None:
            self._inner_rows(event, keys, rows)
        else:
            for uri, *values in rows:
                self._inner_fields(event, cast(str, uri), dict(zip(keys, values, strict=True)))
        if event not in _OPERATOR_EVENTS:
            return
        for uri, *values in rows:
            try:
                self._operator(event, cast(str, uri), dict(zip(keys, values, strict=True)))
            except Exception:  # a log line must never stop delivery
                logging.getLogger(ROOT).debug("operator log failed", exc_info=True)

    @staticmethod
    def _operator(name: str, uri: str, f: Mapping[str, FieldValue]) -> None:
        addr, prev, reason = f.get("addr"), f.get("prev_addr"), f.get("reason")
        if name == "session_started":
            event("session_up", uri=uri, addr=addr, prev_addr=prev, call_id=f.get("call_id"))
        elif name == "session_reinvited":
            if prev is not None and addr != prev:
                event("moved", uri=uri, addr=addr, prev_addr=prev)
        elif name == "session_ended":
            event("session_down", uri=uri, addr=addr, reason=reason)
        elif name == "media_disconnected" and reason != "session ended":  # that is session_down
            event("disconnected", level=logging.WARNING, uri=uri, addr=addr, reason=reason)
        elif name == "notify_dropped":
            if f.get("channel") == "sms":
                event(
                    "sms_failed", level=logging.WARNING, uri=uri, nseq=f.get("nseq"), reason=reason
                )
            elif isinstance(reason, str) and reason.startswith("queue overflow"):
                event(
                    "queue_overflow",
                    level=logging.WARNING,
                    uri=uri,
                    nseq=f.get("nseq"),
                    reason=reason,
                )
            else:
                event(
                    "notify_dropped",
                    level=logging.WARNING,
                    uri=uri,
                    nseq=f.get("nseq"),
                    reason=reason,
                )
        elif name == "sms_sent":
            event("sms_sent", uri=uri, nseq=f.get("nseq"), cost=f.get("cost"), reason=reason)


def add_arguments(parser: Any) -> None:
    """``--log-level``, ``--log-format``, ``--log-file`` on a daemon's parser."""
    group = parser.add_argument_group("logging")
    group.add_argument("--log-level", choices=LEVELS, default="info", help="default: info")
    group.add_argument(
        "--log-format", choices=FORMATS, default="kv", help="key=value (default) or json lines"
    )
    group.add_argument("--log-file", type=Path, help="append to this file (default: stderr)")


def setup_from_args(args: Any) -> logging.Handler:
    """:func:`setup` from the options :func:`add_arguments` added."""
    return setup(args.log_level, args.log_format, args.log_file)
