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
from mdeci.broker.sink import MemorySink

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
