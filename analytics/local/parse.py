"""Reading JSON-lines churn logs into events and quarantined lines, by Spark's rules.

The rules are those of :func:`analytics.parse.parse_lines` as Spark applies them, so that
a line is valid, or quarantined for the same reason, whichever engine reads it:

- files are split into lines at ``\\n``, ``\\r\\n`` and ``\\r`` (Hadoop's line reader),
  decoded as UTF-8 with bad bytes replaced; a line of spaces only is skipped;
- a line is a record when it starts with a JSON object (text after it is ignored, as
  Spark's parser stops at the end of the first value); a field of the schema must have
  its type: a text field takes any JSON value (a number or an object becomes its JSON
  text), a count an integer in 64 bits, a number any JSON number or one of the words
  Spark's reader takes for NaN and the infinities; unknown fields are ignored;
- then, in :mod:`analytics.parse`'s order: no ``ts``, a ``ts`` Spark does not read as a
  time (:mod:`analytics.local.timestamps`), no ``event``, an event outside the
  vocabulary, a ``uri`` missing or made of spaces;
- exact duplicates (every field equal) are kept once, as ``valid_events`` keeps them.

Spark's reader also takes single-quoted JSON strings; this one does not, so such a line
is quarantined here and read there (no writer of the log quotes so).
"""

from __future__ import annotations

import bz2
import gzip
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pyspark.sql import types as T

from analytics import parse as P
from analytics import schema as S
from analytics.local.timestamps import ts_ms

Event = dict[str, Any]

# The compressed files Spark's text reader opens by their suffix, and how to open them
# here; a file with another codec suffix needs Spark (see :func:`readable`).
OPENERS: dict[str, Callable[[Path, str], IO[bytes]]] = {
    ".gz": gzip.open,  # type: ignore[dict-item]
    ".bz2": bz2.open,  # type: ignore[dict-item]
}
SPARK_CODECS = (".deflate", ".zst", ".lz4", ".snappy", ".br", ".lzo", ".xz")


def _kind(dtype: T.DataType) -> str:
    if isinstance(dtype, T.LongType):
        return "long"
    return "double" if isinstance(dtype, T.DoubleType) else "str"


_FIELDS: tuple[tuple[str, str], ...] = tuple((name, _kind(t)) for name, t in S.CHURN_FIELDS)
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
# The texts Spark's JSON reader takes as a double besides numbers.
_DOUBLE_WORDS = {
    "NaN": math.nan,
    "Infinity": math.inf,
    "+Infinity": math.inf,
    "+INF": math.inf,
    "-Infinity": -math.inf,
    "-INF": -math.inf,
}
_EVENTS = frozenset(S.EVENTS)
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_NEWLINES = re.compile(rb"\r\n|\r|\n")


@dataclass(slots=True)
class ParsedLog:
    """What :func:`read_log` read: counts, quarantined lines, de-duplicated events."""

    lines: int = 0
    invalid: int = 0
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


class _Bad(Exception):
    """A field of the line does not have its schema type."""


def readable(paths: list[str]) -> bool:
    """Whether every file of ``paths`` is one this module opens (plain, gzip, bzip2)."""
    return not any(p.endswith(SPARK_CODECS) for p in paths)


def spark_uri(path: str) -> str:
    """A local path as Spark names the file in ``_metadata.file_path`` (``file:/a%20b``)."""
    keep = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/-._~!$&'()*+,;=:@")
    out = []
    for ch in path:
        if ch in keep or (ord(ch) > 127 and not ch.isspace() and ch.isprintable()):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "file:" + "".join(out)


def lines_of(path: Path) -> Iterator[str]:
    """The lines of ``path`` (decompressed by suffix, as Spark opens it), decoded."""
    opener = OPENERS.get(path.suffix)
    if opener is None:
        data = path.read_bytes()
    else:
        with opener(path, "rb") as f:
            data = f.read()
    parts = _NEWLINES.split(data)
    if parts and parts[-1] == b"":
        parts.pop()  # the newline that ends the last line starts no record
    for raw in parts:
        yield raw.decode("utf-8", "replace")


def _text(value: Any) -> str:
    # Spark keeps a non-string value of a text field as its JSON text.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _clean(text: str) -> str:
    """``text`` with lone surrogates (from ``\\ud83d`` escapes) as ``?``, as Spark stores
    them: they have no UTF-8 form."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _field(kind: str, value: Any, escaped: bool) -> Any:
    if value is None:
        return None
    if kind == "str":
        if isinstance(value, str):
            return _clean(value) if escaped else value
        text = _text(value)
        return _clean(text) if escaped else text
    if isinstance(value, bool):
        raise _Bad
    if kind == "long":
        if isinstance(value, int) and _LONG_MIN <= value <= _LONG_MAX:
            return value
        raise _Bad
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    if isinstance(value, float):
        return value
    if isinstance(value, str) and value in _DOUBLE_WORDS:
        return _DOUBLE_WORDS[value]
    raise _Bad


def parse_line(text: str) -> Event | str:
    """The event of one non-blank line, or why it is quarantined (an
    :mod:`analytics.parse` reason). Never raises."""
    try:
        start = _JSON_SPACE.match(text)
        obj, _end = _DECODER.raw_decode(text, start.end() if start else 0)
    except (ValueError, RecursionError):
        return P.NOT_A_RECORD
    if not isinstance(obj, dict):
        return P.NOT_A_RECORD
    escaped = "\\u" in text
    try:
        event: Event = {name: _field(kind, obj.get(name), escaped) for name, kind in _FIELDS}
    except _Bad:
        return P.NOT_A_RECORD
    ts = event["ts"]
    if ts is None:
        return P.MISSING_TS
    ms = ts_ms(ts)
    if ms is None:
        return P.BAD_TS
    name = event["event"]
    if name is None:
        return P.MISSING_EVENT
    if name not in _EVENTS:
        return P.UNKNOWN_EVENT
    uri = event["uri"]
    if uri is None or uri.strip(" ") == "":
        return P.MISSING_URI
    event["ts_ms"] = ms
    return event


def _key(event: Event) -> tuple[Any, ...]:
    # NaN equals NaN among de-duplication keys (Spark normalises it); in a tuple it would not.
    return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in event.values())


def read_log(paths: list[str]) -> ParsedLog:
    """Every line of ``paths``: counted, quarantined with its reason and file, or an event;
    exact duplicates kept once."""
    out = ParsedLog()
    seen: set[tuple[Any, ...]] = set()
    for name in paths:
        source = spark_uri(name)
        for line in lines_of(Path(name)):
            if line.strip(" ") == "":
                continue
            out.lines += 1
            got = parse_line(line)
            if isinstance(got, str):
                out.invalid += 1
                out.quarantine.append({"line": line, "reason": got, "source": source})
                continue
            key = _key(got)
            if key not in seen:
                seen.add(key)
                out.events.append(got)
    return out
