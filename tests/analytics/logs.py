"""Building tiny churn logs by hand: one JSON line per event, times in seconds."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2024, 5, 6, 10, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


def ts(seconds: float) -> str:
    """RFC 3339 UTC with milliseconds, ``seconds`` after T0."""
    t = T0 + timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def ms(seconds: float) -> int:
    """Epoch milliseconds of ``seconds`` after T0."""
    return T0_MS + round(seconds * 1000)


def line(seconds: float, event: str, uri: str = "sip:alice@example.net", **fields: Any) -> str:
    """One churn-log line."""
    record: dict[str, Any] = {"ts": ts(seconds), "node": "broker-1", "event": event, "uri": uri}
    record.update(fields)
    return json.dumps(record)


def _key(row: tuple[Any, ...]) -> tuple[tuple[bool, str], ...]:
    return tuple((v is None, repr(v)) for v in row)


def _same(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= tol * max(1.0, abs(a), abs(b))
    return bool(a == b)


def assert_frames_equal(actual: Any, expected: Any, *, tol: float = 1e-9) -> None:
    """Same schema (names and types), same rows in any order, floats within ``tol``.

    ``pyspark.testing.assertDataFrameEqual`` does this too, but it imports
    ``pyspark.pandas``, which does not load with the pandas 3 installed here.
    """
    assert actual.schema.simpleString() == expected.schema.simpleString()
    got = sorted((tuple(r) for r in actual.collect()), key=_key)
    want = sorted((tuple(r) for r in expected.collect()), key=_key)
    assert len(got) == len(want), f"{len(got)} rows, expected {len(want)}:\n{got}\n{want}"
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w) and all(_same(x, y, tol) for x, y in zip(g, w, strict=True)), (
            f"row differs:\n  got      {g}\n  expected {w}"
        )
