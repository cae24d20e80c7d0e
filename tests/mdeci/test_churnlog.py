"""The churn log writer: fields, ts format, events, rotation, durability per line."""

from __future__ import annotations

import functools
import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from random import Random
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mdeci.churnlog import (
    AUTHORITY,
    FIELDS,
    ChurnLog,
    Event,
    Role,
    format_ts,
    make_record,
    record_of,
)
from mdeci.errors import ChurnLogError, MdeciError

# 2026-11-22T21:05:03.123Z
T0 = 1795381503.123


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def test_ts_format() -> None:
    assert format_ts(T0) == "2026-11-22T21:05:03.123Z"
    assert format_ts(0) == "1970-01-01T00:00:00.000Z"
    assert format_ts(1.9999) == "1970-01-01T00:00:01.999Z"  # truncated, never the next second
    assert format_ts(1.0005) == "1970-01-01T00:00:01.000Z"


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 4_102_444_800, allow_nan=False))
def test_ts_is_rfc3339_utc_millis(epoch: float) -> None:
    text = format_ts(epoch)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", text)
    from datetime import datetime

    parsed = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    assert epoch - 0.001 - 1e-6 <= parsed <= epoch + 1e-6


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e20])
def test_ts_rejects_bad_times(bad: float) -> None:
    with pytest.raises(ChurnLogError):
        format_ts(bad)


def test_fields_order_and_omission(tmp_path: Path) -> None:
    path = tmp_path / "churn.log"
    with ChurnLog(path, "broker-1", Clock(), role=Role.BROKER) as log:
        log.write(Event.REGISTERED, uri="sip:alice@example.org", addr="127.0.0.2:5070")
        log.write(
            "notify_delivered",
            uri="sip:alice@example.org",
            call_id="c1@x",
            addr="127.0.0.3:40000",
            prev_addr="127.0.0.2:40000",
            channel="ip",
            queue_depth=0,
            nseq=17,
            latency_ms=12,
            bytes=90,
            cost=0,
            reason="flushed après re-INVITE",
            missed=2,
            published="2026-11-22T21:05:02.900Z",
            prev_node="broker-0",
        )
    raw = path.read_text("utf-8")
    assert raw.endswith("\n")
    first, second = raw.splitlines()
    assert first == (
        '{"ts":"2026-11-22T21:05:03.123Z","node":"broker-1","role":"broker",'
        '"event":"registered","uri":"sip:alice@example.org","addr":"127.0.0.2:5070"}'
    )
    rec = json.loads(second)
    assert list(rec) == list(FIELDS)  # every field, in §8 order
    assert rec["latency_ms"] == 12.0 and isinstance(rec["latency_ms"], float)
    assert isinstance(rec["cost"], float)
    assert rec["queue_depth"] == 0  # zero is a value, not omitted
    assert "après" in second  # UTF-8, not \\u escapes


def test_write_returns_the_record(tmp_path: Path) -> None:
    with ChurnLog(tmp_path / "c.log", "agent-1", Clock()) as log:
        rec = log.write(Event.IP_CHANGED, uri="sip:a@x", addr="1.2.3.4:5", prev_addr="::1:5")
    assert rec == lines(tmp_path / "c.log")[0]


def test_clock_is_read_per_line(tmp_path: Path) -> None:
    clock = Clock(0.0)
    with ChurnLog(tmp_path / "c.log", "n", clock) as log:
        log.write(Event.SESSION_STARTED, uri="sip:a@x")
        clock.now = 60.5
        log.write(Event.SESSION_ENDED, uri="sip:a@x")
    assert [r["ts"] for r in lines(tmp_path / "c.log")] == [
        "1970-01-01T00:00:00.000Z",
        "1970-01-01T00:01:00.500Z",
    ]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"event": "registerd"}, "unknown churn event 'registerd'"),
        ({"event": "REGISTERED"}, "unknown churn event"),
        ({"channel": "pigeon"}, "channel must be 'ip' or 'sms'"),
        ({"nseq": "5"}, "'nseq' has type str"),
        ({"nseq": True}, "'nseq' has type bool"),
        ({"queue_depth": 1.5}, "'queue_depth' has type float"),
        ({"bytes": None, "cost": "1"}, "'cost' has type str"),
        ({"latency_ms": float("nan")}, "not finite"),
        ({"uri": 5}, "'uri' has type int"),
        ({"reason": b"x"}, "'reason' has type bytes"),
        ({"colour": "red"}, "unknown churn log field 'colour'"),
        ({"colour": None, "zone": 1}, "unknown churn log field 'zone'"),
    ],
)
def test_invalid_records_rejected(tmp_path: Path, kwargs: dict[str, object], fragment: str) -> None:
    args: dict[str, object] = {"event": Event.REGISTERED, "uri": "sip:a@x", **kwargs}
    event = args.pop("event")
    with ChurnLog(tmp_path / "c.log", "n", Clock()) as log:
        with pytest.raises(ChurnLogError) as info:
            log.write(event, **args)  # type: ignore[arg-type]
        assert fragment in str(info.value)
        assert isinstance(info.value, MdeciError)
    assert (tmp_path / "c.log").read_bytes() == b""  # nothing half-written


def test_unencodable_text_rejected(tmp_path: Path) -> None:
    with ChurnLog(tmp_path / "c.log", "n", Clock()) as log, pytest.raises(ChurnLogError):
        log.write(Event.REGISTERED, uri="sip:\ud800@x")


def test_make_record_is_pure() -> None:
    assert make_record(0, "n", Event.SMS_SENT, uri="u", channel="sms", bytes=140, cost=0.05) == {
        "ts": "1970-01-01T00:00:00.000Z",
        "node": "n",
        "event": "sms_sent",
        "uri": "u",
        "channel": "sms",
        "bytes": 140,
        "cost": 0.05,
    }


FIELD_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "call_id": st.text(max_size=8),
        "addr": st.text(max_size=8),
        "channel": st.sampled_from(["ip", "sms"]),
        "queue_depth": st.integers(0, 10**6),
        "nseq": st.integers(0, 10**9),
        "latency_ms": st.floats(0, 1e6) | st.integers(0, 1000),
        "reason": st.none() | st.text(max_size=8),
        "cost": st.floats(0, 10),
    },
)


@given(fields=FIELD_VALUES, order=st.randoms(use_true_random=False))
def test_the_mapping_path_builds_the_same_record_in_section_8_order(
    fields: dict[str, object], order: Random
) -> None:
    # record_of (what the broker's sink calls, no keyword packing) and make_record agree,
    # whatever order the fields come in; its field-order cache changes nothing.
    keys = list(fields)
    order.shuffle(keys)
    shuffled = {key: fields[key] for key in keys}
    built = record_of(1.5, "n", "notify_delivered", "sip:a@x", Role.BROKER, shuffled)
    kwargs: Any = fields  # the strategy draws only §8 names, with their types
    assert built == make_record(
        1.5, "n", Event.NOTIFY_DELIVERED, uri="sip:a@x", role=Role.BROKER, **kwargs
    )
    assert list(built) == [f for f in FIELDS if f in built]
    assert all(value is not None for value in built.values())


def test_rotation_by_size(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "churn.log"  # the folder is created
    with ChurnLog(path, "n", Clock(), max_bytes=300, backups=2) as log:
        for i in range(30):
            log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=i + 1, queue_depth=i)
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["churn.log", "churn.log.1", "churn.log.2"]
    for p in path.parent.iterdir():
        assert 0 < p.stat().st_size <= 300
    # newest in churn.log, then .1, then .2; consecutive and gap-free across the three
    nseqs = [
        int(str(r["nseq"]))
        for name in ("churn.log.2", "churn.log.1", "churn.log")
        for r in lines(path.parent / name)
    ]
    assert nseqs == list(range(nseqs[0], 31))
    assert nseqs[0] > 1  # the oldest lines were rotated out


def test_rotation_without_backups(tmp_path: Path) -> None:
    path = tmp_path / "churn.log"
    with ChurnLog(path, "n", Clock(), max_bytes=200, backups=0) as log:
        for i in range(10):
            log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=i + 1)
    assert [p.name for p in tmp_path.iterdir()] == ["churn.log"]
    assert lines(path)[-1]["nseq"] == 10


def test_a_failed_rotation_keeps_the_log_open_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rotation that fails does not close the log for good (every later line would be
    lost): the current file keeps growing, the failure is logged once, and rotation works
    again as soon as the obstacle is gone."""
    caplog.set_level(logging.WARNING, logger="mdeci.churnlog")
    path = tmp_path / "churn.log"
    blocker = tmp_path / "churn.log.1"
    blocker.mkdir()
    (blocker / "in-the-way").write_text("x")  # a non-empty folder: the rename fails
    with ChurnLog(path, "n", Clock(), max_bytes=300, backups=1) as log:
        for i in range(20):
            log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=i + 1)
        assert not log.closed and log.rotation_failures > 1
        assert [r["nseq"] for r in lines(path)] == list(range(1, 21))  # nothing lost
        warnings = [r for r in caplog.records if r.getMessage() == "churnlog_error"]
        assert len(warnings) == 1  # once per failure streak, not per line
        blocker.joinpath("in-the-way").unlink()
        blocker.rmdir()
        log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=21)
    assert [r["nseq"] for r in lines(path)] == [21]
    assert [r["nseq"] for r in lines(blocker)] == list(range(1, 21))


def test_a_failed_reopen_is_retried_on_the_next_line(tmp_path: Path) -> None:
    path = tmp_path / "churn.log"
    with ChurnLog(path, "n", Clock(), max_bytes=1, backups=0) as log:  # rotate every line
        log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=1)
        path.unlink()
        path.mkdir()  # something in the way: neither removed nor opened as a file
        with pytest.raises(ChurnLogError, match="cannot open"):
            log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=2)
        path.rmdir()
        log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=3)
        assert not log.closed
    assert [r["nseq"] for r in lines(path)] == [3]


def test_oversize_line_goes_alone_into_a_fresh_file(tmp_path: Path) -> None:
    path = tmp_path / "churn.log"
    with ChurnLog(path, "n", Clock(), max_bytes=50, backups=3) as log:
        log.write(Event.REGISTERED, uri="sip:a@x", reason="x" * 100)
        log.write(Event.REGISTERED, uri="sip:a@x", reason="y" * 100)
    assert len(lines(path)) == 1 and lines(path)[0]["reason"] == "y" * 100
    assert lines(tmp_path / "churn.log.1")[0]["reason"] == "x" * 100


def test_reopen_appends_and_counts_existing_size(tmp_path: Path) -> None:
    path = tmp_path / "churn.log"
    with ChurnLog(path, "n", Clock(), max_bytes=10_000) as log:
        log.write(Event.REGISTERED, uri="sip:a@x")
    size = path.stat().st_size
    with ChurnLog(path, "n", Clock(), max_bytes=size + 10, backups=1) as log:
        log.write(Event.UNREGISTERED, uri="sip:a@x")
    assert [r["event"] for r in lines(path)] == ["unregistered"]
    assert [r["event"] for r in lines(tmp_path / "churn.log.1")] == ["registered"]


def test_each_line_reaches_the_os_at_once(tmp_path: Path) -> None:
    """A child writes a line then is killed with SIGKILL: the line is in the file."""
    path = tmp_path / "churn.log"
    code = (
        "import os, signal\n"
        "from mdeci.churnlog import ChurnLog, Event\n"
        f"log = ChurnLog({str(path)!r}, 'n', lambda: 0.0)\n"
        "log.write(Event.MEDIA_DISCONNECTED, uri='sip:a@x', reason='before kill')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60, check=False)
    assert proc.returncode == -9
    assert lines(path) == [
        {
            "ts": "1970-01-01T00:00:00.000Z",
            "node": "n",
            "event": "media_disconnected",
            "uri": "sip:a@x",
            "reason": "before kill",
        }
    ]


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    log = ChurnLog(tmp_path / "c.log", "n", Clock())
    assert not log.closed
    log.close()
    log.close()
    assert bool(log.closed)  # bool(): mypy keeps the narrowing of the first assert
    with pytest.raises(ChurnLogError, match="closed"):
        log.write(Event.REGISTERED, uri="sip:a@x")


def test_constructor_checks(tmp_path: Path) -> None:
    with pytest.raises(ChurnLogError, match="node"):
        ChurnLog(tmp_path / "c.log", "", Clock())
    with pytest.raises(ChurnLogError, match="max_bytes"):
        ChurnLog(tmp_path / "c.log", "n", Clock(), max_bytes=0)
    with pytest.raises(ChurnLogError, match="backups"):
        ChurnLog(tmp_path / "c.log", "n", Clock(), backups=-1)
    (tmp_path / "dir.log").mkdir()
    with pytest.raises(ChurnLogError, match="cannot open churn log"):
        ChurnLog(tmp_path / "dir.log", "n", Clock())


def test_every_event_has_one_authoritative_role_and_a_bad_role_is_refused(tmp_path: Path) -> None:
    assert set(AUTHORITY) == set(Event)
    assert AUTHORITY[Event.IP_CHANGED] is Role.AGENT  # only the device sees its address
    assert AUTHORITY[Event.NOTIFY_DELIVERED] is Role.BROKER  # the broker's ack is the fact
    assert "role" not in make_record(0, "n", Event.REGISTERED, uri="u")
    assert make_record(0, "n", Event.REGISTERED, uri="u", role=Role.AGENT)["role"] == "agent"
    with pytest.raises(ChurnLogError):
        ChurnLog(tmp_path / "c.log", "n", Clock(), role="switch")  # type: ignore[arg-type]


def _tree(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text("utf-8") for p in sorted(folder.iterdir())}


@settings(max_examples=40, deadline=None)
@given(
    bursts=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    max_bytes=st.sampled_from([150, 300, 1000, 100_000]),
)
def test_a_deferred_log_writes_the_same_files_once_per_burst(
    tmp_path_factory: pytest.TempPathFactory, bursts: list[int], max_bytes: int
) -> None:
    """With ``defer``, a burst of lines is one write, and the files (rotation
    included) are byte for byte those of a log writing each line at once."""
    plain_dir, deferred_dir = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("def")
    scheduled: list[object] = []
    plain = ChurnLog(plain_dir / "c.log", "n", Clock(), max_bytes=max_bytes, backups=3)
    deferred = ChurnLog(
        deferred_dir / "c.log", "n", Clock(), max_bytes=max_bytes, backups=3,
        defer=scheduled.append,
    )  # fmt: skip
    nseq = 0
    for size in bursts:
        for _ in range(size):
            nseq += 1
            for log in (plain, deferred):
                log.write(Event.NOTIFY_DELIVERED, uri="sip:a@x", nseq=nseq, latency_ms=1.5)
        assert scheduled == ([deferred.flush] if size else [])
        deferred.flush()
        scheduled.clear()
        assert _tree(plain_dir) == _tree(deferred_dir)
    plain.close()
    deferred.close()


def _count_writes(log: ChurnLog) -> list[int]:
    """The sizes of the log file's writes from now on (one entry per write call)."""
    sizes: list[int] = []
    assert log._file is not None
    real = log._file.write

    def counting(data: memoryview) -> int:
        sizes.append(len(data))
        return real(data)

    log._file.write = counting  # type: ignore[method-assign,assignment]
    return sizes


def test_a_deferred_burst_is_one_write_and_close_writes_what_is_kept(tmp_path: Path) -> None:
    scheduled: list[object] = []
    log = ChurnLog(tmp_path / "c.log", "n", Clock(), defer=scheduled.append)
    for n in range(5):
        log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=n + 1, queue_depth=n)
    assert len(scheduled) == 1 and (tmp_path / "c.log").read_text() == ""  # kept
    sizes = _count_writes(log)
    log.flush()
    assert len(sizes) == 1 and [r["nseq"] for r in lines(tmp_path / "c.log")] == [1, 2, 3, 4, 5]
    log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=6, queue_depth=0)
    assert len(scheduled) == 2  # a new burst schedules a new flush
    log.close()  # the loop may never run it: close writes it
    assert [r["nseq"] for r in lines(tmp_path / "c.log")] == [1, 2, 3, 4, 5, 6]


def test_a_failed_deferred_write_is_counted_and_reported_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = ChurnLog(tmp_path / "c.log", "n", Clock(), defer=lambda _f: None)
    log.write(Event.NOTIFY_QUEUED, uri="sip:a@x", nseq=1, queue_depth=0)
    assert log._file is not None

    def failing(data: memoryview) -> int:
        raise OSError(28, "No space left on device")

    log._file.write = failing  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.WARNING):
        log.flush()
    assert log.write_failures == 1
    assert "churnlog_error" in caplog.text


# ---------------------------------------------------------------------- the fast encoder

# Any value of any type a caller might pass, valid or not: exact and other ints (bool),
# floats with their edge cases, text with quotes, controls, non-ASCII and lone surrogates.
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e6, 1e6),
    st.text(st.characters(blacklist_categories=()), max_size=12),
    st.sampled_from(["ip", "sms", "IP", "\ud800", 'a"b\\c\n\x00é€😀']),
    st.just(b"bytes"),
    st.just(Role.BROKER),  # a str subclass
)
# Mostly a §8 event (the fast encoder's case), sometimes not one.
ANY_EVENT = st.sampled_from(
    [*Event, "notify_queued", "notify_delivered", "notify_dropped"] * 2
    + ["", "Notify_Queued", "notify_queued ", "nope"]
)


def mostly(usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``usual`` nine times in ten, else ``rare`` (one_of would draw them evenly)."""
    return st.integers(0, 9).flatmap(lambda i: usual if i else rare)


# Any text; lone surrogates (which the log refuses) now and then.
TEXT = mostly(st.text(max_size=12), st.text(st.characters(blacklist_categories=()), max_size=12))
ANY_URI = mostly(TEXT, ANY_VALUE)
FIELD_NAMES = st.sampled_from([*FIELDS[5:], "bogus", "ts", "uri"])


def typed_value(key: str) -> st.SearchStrategy[Any]:
    """Mostly a value of the field's §8 type (any such value: the fast encoder's case,
    and its edges), sometimes anything."""
    if key in ("queue_depth", "nseq", "bytes"):
        typed: st.SearchStrategy[Any] = st.integers() | st.integers(0, 10**6)
    elif key in ("latency_ms", "cost"):
        typed = st.floats(allow_nan=True, allow_infinity=True)
    elif key == "channel":
        typed = st.sampled_from(["ip", "sms", "IP", "", "ip "]) | TEXT
    else:
        typed = TEXT
    return mostly(typed, ANY_VALUE)


# Mostly distinct §8 names, in any order (the fast encoder's case), sometimes others.
SECTION_8_KEYS = st.lists(st.sampled_from(FIELDS[5:]), unique=True, max_size=5)
ANY_KEYS = mostly(SECTION_8_KEYS, st.lists(FIELD_NAMES, max_size=4))
TYPED_FIELDS = ANY_KEYS.flatmap(
    lambda keys: st.fixed_dictionaries({key: typed_value(key) for key in keys})
)
ANY_EPOCH = st.one_of(
    st.floats(0, 4e9), st.integers(0, 4 * 10**9), st.sampled_from([T0, T0 + 0.0005, T0 + 1.0])
)


def _outcome(call: Any) -> tuple[str, object]:
    """What a call gave: its result, or the type of what it raised."""
    try:
        return ("ok", call())
    except Exception as exc:  # the general path's error, whatever it is
        return ("raised", type(exc))


INF, NAN = float("inf"), float("nan")
# The edges the fast encoder must leave to the general path, drawn or not.
EDGE_FIELDS: list[dict[str, Any]] = [
    {"nseq": 1, "latency_ms": INF},
    {"nseq": 1, "cost": NAN},
    {"nseq": "1", "queue_depth": 2},
    {"nseq": True},
    {"bytes": 2**80, "latency_ms": 2**80},
    {"latency_ms": 3},
    {"channel": "IP", "nseq": 1},
    {"channel": 1},
    {"reason": "\ud800"},
    {"addr": Role.AGENT, "prev_addr": None},
    {"bogus": None, "nseq": 2},
    {"bogus": 1},
]


def _with_edges(test: Any) -> Any:
    for fields in EDGE_FIELDS:
        test = example(epochs=[T0], event="notify_delivered", uri="sip:a@x", fields=fields,
                       role=Role.BROKER)(test)  # fmt: skip
    return example(epochs=[T0], event="notify_queued", uri=3, fields={}, role=None)(test)


@settings(max_examples=400, deadline=None)
@_with_edges
@given(
    epochs=st.lists(ANY_EPOCH, min_size=1, max_size=4),
    event=ANY_EVENT,
    uri=ANY_URI,
    fields=TYPED_FIELDS,
    role=st.sampled_from([Role.BROKER, Role.AGENT, None]),
)
def test_the_fast_encoder_writes_the_bytes_of_the_general_path(
    tmp_path_factory: pytest.TempPathFactory,
    epochs: list[float],
    event: str,
    uri: Any,
    fields: dict[str, Any],
    role: Role | None,
) -> None:
    """ChurnLog.add (the broker's single events: no record dict, text built directly)
    writes byte for byte what append (record_of + the JSON encoder) writes, and refuses
    (raises the same error) exactly what it refuses, for any values of any type; over a
    few clock readings, as its per-millisecond ts cache must not leak between them."""
    folder = tmp_path_factory.mktemp("enc")
    clock = Clock()
    general = ChurnLog(folder / "general.log", 'node-é"1', clock, role=role)
    fast = ChurnLog(folder / "fast.log", 'node-é"1', clock, role=role)
    for epoch in epochs:
        clock.now = epoch
        want = _outcome(lambda: general.append(event, uri, fields) and None)
        assert _outcome(lambda: fast.add(event, uri, fields)) == want
    general.close()
    fast.close()
    assert (folder / "fast.log").read_bytes() == (folder / "general.log").read_bytes()


ROWS = ANY_KEYS.flatmap(
    lambda keys: st.tuples(
        st.just(keys),
        st.lists(
            mostly(
                st.tuples(ANY_URI, *(typed_value(key) for key in keys)),
                st.lists(ANY_VALUE, max_size=len(keys) + 2).map(tuple),
            ),
            max_size=6,
        ),
    )
)


@settings(max_examples=300, deadline=None)
@example(
    event="notify_delivered",
    shape=(["nseq", "latency_ms"], [("a", 1, INF), ("b", 2, 1.0)]),
    epoch=T0,
)
@example(
    event="notify_queued",
    shape=(["queue_depth", "nseq"], [("a", 1, "2"), ("a", 1, None)]),
    epoch=T0,
)
@example(
    event="notify_delivered",
    shape=(["nseq", "channel"], [("a", 1, "IP"), ("a", 1, "sms")]),
    epoch=T0,
)
@example(
    event="notify_dropped",
    shape=(["reason"], [("a", "\ud800"), ("\ud800", "r"), (None, "r")]),
    epoch=T0,
)
@example(event="notify_dropped", shape=(["nseq", "nseq"], [("a", 1, "x"), ("a", 1)]), epoch=T0)
@example(
    event="notify_dropped", shape=(["nseq"], [("a", True), ("a", 2**70), (Role.AGENT, 2)]), epoch=T0
)
@example(event="nope", shape=(["nseq"], [("a", 1)]), epoch=T0)
@given(event=ANY_EVENT, shape=ROWS, epoch=ANY_EPOCH)
def test_rows_are_written_as_the_general_path_writes_each_record(
    tmp_path_factory: pytest.TempPathFactory,
    event: str,
    shape: tuple[list[str], list[tuple[Any, ...]]],
    epoch: float,
) -> None:
    """ChurnLog.add_rows (a publish's queued and an ack's delivered notifications, with
    a generated encoder per set of fields) writes what append writes for each row's
    record, in row order, and leaves out (counts) exactly the records append refuses;
    rows of the wrong width are refused too."""
    keys, drawn = shape
    width = len(keys) + 1
    folder = tmp_path_factory.mktemp("rows")
    general = ChurnLog(folder / "general.log", "n", Clock(epoch), role=Role.BROKER)
    fast = ChurnLog(folder / "fast.log", "n", Clock(epoch), role=Role.BROKER)
    refused = 0
    for row in drawn:
        if len(row) != width:
            refused += 1
            continue
        fields = dict(zip(keys, row[1:], strict=True))
        if _outcome(functools.partial(general.append, event, row[0], fields))[0] == "raised":
            refused += 1
    assert fast.add_rows(event, tuple(keys), drawn) == refused
    general.close()
    fast.close()
    assert (folder / "fast.log").read_bytes() == (folder / "general.log").read_bytes()


def test_rows_take_one_clock_reading_and_one_write(tmp_path: Path) -> None:
    reads: list[float] = []

    def clock() -> float:
        reads.append(T0)
        return T0

    log = ChurnLog(tmp_path / "c.log", "n", clock, role=Role.BROKER)
    sizes = _count_writes(log)
    keys = ("nseq", "latency_ms")
    assert (
        log.add_rows(Event.NOTIFY_DELIVERED, keys, [("sip:a@x", n, n / 3) for n in range(50)]) == 0
    )
    assert len(reads) == 1 and len(sizes) == 1
    got = lines(tmp_path / "c.log")
    assert [r["nseq"] for r in got] == list(range(50))
    assert got[7] == {
        "ts": "2026-11-22T21:05:03.123Z",
        "node": "n",
        "role": "broker",
        "event": "notify_delivered",
        "uri": "sip:a@x",
        "nseq": 7,
        "latency_ms": 7 / 3,
    }
    log.close()


@pytest.mark.parametrize("deferred", [False, True])
@pytest.mark.parametrize("max_bytes", [150, 300, 1000])
def test_rows_rotate_as_the_same_lines_one_by_one(
    tmp_path_factory: pytest.TempPathFactory, max_bytes: int, deferred: bool
) -> None:
    """A batch of rows that crosses max_bytes rotates before the line that would pass it,
    as those lines written one at a time do (one write per stretch between rotations)."""
    plain_dir, rows_dir = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("rows")
    scheduled: list[Any] = []
    plain = ChurnLog(plain_dir / "c.log", "n", Clock(), max_bytes=max_bytes, backups=3)
    rows = ChurnLog(
        rows_dir / "c.log", "n", Clock(), max_bytes=max_bytes, backups=3,
        defer=scheduled.append if deferred else None,
    )  # fmt: skip
    batches = [[(f"sip:u{n}@x", n, n * 1.5) for n in range(k, k + size)] for k, size in
               [(0, 3), (3, 1), (4, 9), (13, 0), (13, 5)]]  # fmt: skip
    for batch in batches:
        for uri, nseq, latency in batch:
            plain.write(Event.NOTIFY_DELIVERED, uri=uri, nseq=nseq, latency_ms=latency)
        assert rows.add_rows(Event.NOTIFY_DELIVERED, ("nseq", "latency_ms"), batch) == 0
        for flush in scheduled:
            flush()
        scheduled.clear()
        assert _tree(rows_dir) == _tree(plain_dir)
    assert len(_tree(rows_dir)) > 1  # it did rotate
    plain.close()
    rows.close()
