"""mdeci.oplog: one line per operator event, key=value or JSON, stderr or a file, no secrets;
and the broker's events as SmsFallback and the core write them become those lines."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from mdeci import oplog
from mdeci.broker.metrics import BrokerMetrics, MetricsSink
from mdeci.broker.sink import ChurnLogSink, FieldValue, MemorySink, emit_rows
from mdeci.churnlog import ChurnLog, Role

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    mdeci_level = logging.getLogger("mdeci").level
    yield None
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)
    logging.getLogger("mdeci").setLevel(mdeci_level)


def test_key_value_and_json_lines_to_a_file(tmp_path: Path, restore_logging: object) -> None:
    log = tmp_path / "broker.log"
    oplog.setup("info", "kv", log)
    oplog.event("session_up", uri="sip:alice@localhost", addr="127.0.0.2:4000", prev_addr=None)
    oplog.event("auth_failed", level=logging.WARNING, source="127.0.0.6:5060", reason="a b=c")
    oplog.event("debug_only", level=logging.DEBUG, x=1)
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    assert lines[0].split(" ", 1)[1] == (
        "level=info logger=mdeci.broker event=session_up uri=sip:alice@localhost "
        "addr=127.0.0.2:4000"
    )
    assert lines[1].endswith('source=127.0.0.6:5060 reason="a b=c"')
    oplog.setup("debug", "json", log)
    oplog.event("sms_sent", uri="sip:bob@localhost", nseq=3, cost=0.0015)
    obj = json.loads(log.read_text().splitlines()[-1])
    assert obj["event"] == "sms_sent" and obj["nseq"] == 3 and obj["level"] == "info"


def test_a_secret_looking_field_is_refused() -> None:
    for name in ("password", "ha1_md5", "session_key", "secret"):
        with pytest.raises(ValueError, match="looks like a secret"):
            # mypy cannot tell that the key is not ``logger`` or ``level``
            oplog.event("x", **{name: "v"})  # type: ignore[arg-type]


def test_each_broker_event_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mdeci")
    inner = MemorySink()
    metrics = BrokerMetrics()
    sink = MetricsSink(oplog.OperatorSink(inner), metrics)
    a = "sip:alice@localhost"
    # As BrokerSipEndpoint, Broker and SmsFallback emit them.
    sink.emit("session_started", a, call_id="c1", addr="127.0.0.2:1", prev_addr=None)
    sink.emit("session_reinvited", a, call_id="c1", addr="127.0.0.2:1", prev_addr="127.0.0.2:1")
    sink.emit("session_reinvited", a, call_id="c1", addr="127.0.0.3:1", prev_addr="127.0.0.2:1")
    sink.emit("media_disconnected", a, addr="127.0.0.3:1", channel="ip", reason="rudp: timeout")
    sink.emit("notify_dropped", a, nseq=4, reason="queue overflow (drop-oldest), msg_id=m")
    sink.emit("sms_sent", a, nseq=5, channel="sms", bytes=90, cost=0.0015, reason="to +15551")
    sink.emit("notify_dropped", a, nseq=5, channel="sms", reason="undeliverable by sms: ttl")
    sink.emit("media_disconnected", a, addr="127.0.0.3:1", channel="ip", reason="session ended")
    sink.emit("session_ended", a, call_id="c1", addr="127.0.0.3:1", reason="bye")
    sink.emit("notify_queued", a, nseq=6, queue_depth=1)
    assert len(inner.events) == 10  # everything reaches the churn log
    assert [r.getMessage() for r in caplog.records] == [
        "session_up",
        "moved",
        "disconnected",
        "queue_overflow",
        "sms_sent",
        "sms_failed",
        "session_down",
    ]
    assert [r.levelname for r in caplog.records].count("WARNING") == 3
    assert metrics.sms_spend._value.get() == pytest.approx(0.0015)


def test_the_daemons_take_the_log_options(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mdeci", "broker", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    for option in ("--log-level", "--log-format", "--log-file"):
        assert option in out
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "mdeci",
            "broker",
            "--config",
            str(ROOT / "configs/broker.toml"),
            "--log-file",
            str(tmp_path / "no" / "such" / "dir.log"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("mdeci broker: error: cannot open --log-file")
    assert bad.stderr.count("\n") == 1


def test_the_dashboard_uses_only_metrics_the_broker_exports() -> None:
    import re

    dashboard = json.loads((ROOT / "configs" / "grafana-mdeci-broker.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bmdeci_[a-z_]+", e)}
    exported = {s.name for family in BrokerMetrics().registry.collect() for s in family.samples}
    assert used and used <= exported, sorted(used - exported)
    assert {"mdeci_sessions", "mdeci_rudp_rtt_seconds", "mdeci_sms_spend_total"} <= used


def _chain(path: Path) -> tuple[MetricsSink, BrokerMetrics, ChurnLog]:
    log = ChurnLog(path, "n", lambda: 1795381503.123, role=Role.BROKER)
    metrics = BrokerMetrics()
    return MetricsSink(oplog.OperatorSink(ChurnLogSink(log)), metrics), metrics, log


def _counts(metrics: BrokerMetrics) -> dict[str, float]:
    return {
        f"{m.name}{s.labels}": s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


def test_rows_move_the_counters_and_write_the_lines_of_the_same_events_one_by_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker hands its notification events down the chain as rows
    (sink.emit_rows). The churn log, the counters and the operator lines are those of
    the same events emitted one by one; a sink without emit_rows gets them one by one."""
    caplog.set_level(logging.INFO, logger="mdeci")
    a, b = "sip:alice@localhost", "sip:bob@localhost"
    batches: list[tuple[str, tuple[str, ...], list[tuple[FieldValue, ...]]]] = [
        ("notify_queued", ("nseq", "queue_depth"), [(a, 1, 1), (b, 1, 1), (a, 2, 2)]),
        ("notify_delivered", ("nseq", "latency_ms"), [(a, 1, 3.5), (a, 2, 0.0)]),
        ("notify_delivered", ("channel", "nseq"), [(b, "sms", 1), (b, "ip", 2)]),
        ("notify_queued", ("nseq", "channel"), [(b, 3, "sms")]),
        ("notify_dropped", ("nseq", "reason"), [(a, 3, "queue overflow (x), msg_id=m")]),
    ]
    one, one_metrics, one_log = _chain(tmp_path / "one.log")
    for event, keys, rows in batches:
        for uri, *values in rows:
            one.emit_fields(event, str(uri), dict(zip(keys, values, strict=True)))
    one_log.close()
    by_one = [r.getMessage() for r in caplog.records]
    caplog.clear()
    rows_sink, rows_metrics, rows_log = _chain(tmp_path / "rows.log")
    memory = MemorySink()
    for event, keys, rows in batches:
        emit_rows(rows_sink, event, keys, rows)
        emit_rows(memory, event, keys, rows)  # no emit_rows: one by one
    rows_log.close()
    assert [r.getMessage() for r in caplog.records] == by_one == ["queue_overflow"]
    assert (tmp_path / "rows.log").read_bytes() == (tmp_path / "one.log").read_bytes()
    assert _counts(rows_metrics) == _counts(one_metrics)
    assert rows_metrics.queued._value.get() == 3  # the sms one is not an ip queueing
    assert rows_metrics._delivered_ip._value.get() == 3
    assert [(e.event, e.uri, dict(e.fields)) for e in memory.events][:2] == [
        ("notify_queued", a, {"nseq": 1, "queue_depth": 1}),
        ("notify_queued", b, {"nseq": 1, "queue_depth": 1}),
    ]
    assert len(memory.events) == 9
