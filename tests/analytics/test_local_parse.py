"""The local engine's parser: any line is an event or quarantined with a known reason,
never an exception; the time reader follows Spark's rules.

Spark's reading of the same lines is compared in ``test_engines.py``; these tests need
no JVM.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from analytics import parse as P
from analytics import schema as S
from analytics.local.parse import parse_line, read_log, spark_uri
from analytics.local.timestamps import days_from_civil, ts_ms

REASONS = {
    P.NOT_A_RECORD,
    P.MISSING_TS,
    P.BAD_TS,
    P.MISSING_EVENT,
    P.UNKNOWN_EVENT,
    P.MISSING_URI,
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
ts_texts = st.one_of(
    st.text(alphabet="0123456789-+:.TZ tUEurope/ParisGMC", max_size=32),
    st.datetimes().map(lambda d: d.isoformat() + "Z"),
)
records = st.fixed_dictionaries(
    {},
    optional={
        "ts": st.one_of(ts_texts, json_values),
        "event": st.sampled_from(S.EVENTS) | json_values,
        "uri": st.text(max_size=10) | json_values,
        "role": st.sampled_from(S.ROLES) | json_values,
        **{name: json_values for name in S.FIELD_NAMES[5:]},
    },
)


def _check(line: str) -> None:
    got = parse_line(line)
    if isinstance(got, str):
        assert got in REASONS
        return
    assert set(got) == {*S.FIELD_NAMES, "ts_ms"}
    assert isinstance(got["ts_ms"], int)
    assert got["event"] in S.EVENTS and got["uri"].strip(" ")
    json.dumps(got)  # every text is valid Unicode: the outputs can be written
    for value in got.values():
        if isinstance(value, str):
            value.encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=string.printable + '{}[]":,\\éü\ud800', max_size=120))
def test_any_text_is_an_event_or_quarantined(line: str) -> None:
    _check(line)


@settings(max_examples=400, deadline=None)
@given(records, st.sampled_from(["", " ", "\t", " trailing", "}"]))
def test_any_object_is_an_event_or_quarantined(record: dict[str, Any], tail: str) -> None:
    _check(json.dumps(record) + tail)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_in_a_file_are_read(tmp_path_factory: Any, data: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("bytes")) / "x.log"
    path.write_bytes(data)
    log = read_log([str(path)])
    assert log.lines == sum(1 for x in data.splitlines() if x.strip(b" "))
    assert len(log.quarantine) == log.invalid
    assert len(log.events) <= log.lines - log.invalid
    for row in log.quarantine:
        assert row["reason"] in REASONS
        json.dumps(row, ensure_ascii=False).encode("utf-8")


def test_a_valid_line_and_each_reason() -> None:
    ok = '{"ts":"2024-03-04T10:00:00.5Z","event":"ip_changed","uri":"sip:a","bytes":3}'
    event = parse_line(ok)
    assert isinstance(event, dict)
    assert (event["ts_ms"], event["bytes"], event["latency_ms"]) == (1709546400500, 3, None)
    cases = {
        '{"ts":"2024-03-04T10:00:00Z","event":"ip_changed","uri":"a","bytes":"3"}': P.NOT_A_RECORD,
        '{"event":"ip_changed","uri":"a"}': P.MISSING_TS,
        '{"ts":"2024-03-04T10:00Z","event":"ip_changed","uri":"a"}': P.BAD_TS,
        '{"ts":"2024-03-04","uri":"a"}': P.MISSING_EVENT,
        '{"ts":"2024-03-04","event":"moved","uri":"a"}': P.UNKNOWN_EVENT,
        '{"ts":"2024-03-04","event":"ip_changed","uri":"   "}': P.MISSING_URI,
    }
    assert {line: parse_line(line) for line in cases} == cases


def test_times_as_spark_reads_them() -> None:
    base = 1709546400000  # 2024-03-04T10:00:00Z
    assert ts_ms("2024-03-04T10:00:00Z") == base
    assert ts_ms("2024-03-04T10:00:00.1239Z") == base + 123  # truncated, not rounded
    assert ts_ms("2024-03-04 10:00:00") == base  # the session's zone is UTC
    assert ts_ms("2024-03-04T10:00:00+01:00") == base - 3_600_000
    assert ts_ms("2024-03-04T11:00:00Europe/Paris") == base
    assert ts_ms("2024-03-04") == base - 10 * 3_600_000
    assert ts_ms("1969-12-31T23:59:59.9995Z") == -1  # floored to the millisecond
    for bad in ("2024-03-04T10:00Z", "2024-02-30T00:00:00Z", "2024-03-04t10:00:00z", "x", ""):
        assert ts_ms(bad) is None
    assert days_from_civil(1970, 1, 1) == 0 and days_from_civil(2000, 3, 1) == 11017


def test_sources_are_named_as_spark_names_them() -> None:
    assert spark_uri("/tmp/in dir/a.log") == "file:/tmp/in%20dir/a.log"
