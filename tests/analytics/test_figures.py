"""The papers' figures (per move, per device, per network, per broker) on hand-made logs.

Each log is what a broker and one or two agents would write around a few moves; the
expected rows are worked out by hand from the definitions in analytics/figures.py.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from analytics import figures, jobs, parse
from analytics import schema as S
from tests.analytics import reference
from tests.analytics.logs import assert_frames_equal, line, ms

pytestmark = pytest.mark.peer("spark")

A = "sip:alice@example.net"
B = "sip:bob@example.net"


def events(spark: Any, lines: list[str]) -> Any:
    random.Random(5).shuffle(lines)  # order in the file never matters
    df = spark.createDataFrame([(x, "t.jsonl") for x in lines], "value string, source string")
    return parse.valid_events(parse.parse_lines(df))


def agent(seconds: float, event: str, uri: str = A, **fields: Any) -> str:
    return line(seconds, event, uri, role="agent", node="agent-a", **fields)


def broker(seconds: float, event: str, uri: str = A, node: str = "broker-1", **f: Any) -> str:
    return line(seconds, event, uri, role="broker", **{"node": node, **f})


def test_each_move_gets_the_restore_losses_and_duplicates_that_followed_it(spark: Any) -> None:
    log = [
        broker(0, "session_started", addr="10.0.1.5:5060"),
        agent(10, "ip_changed", addr="10.0.2.5:5060", prev_addr="10.0.1.5:5060", reason="handover"),
        agent(10.3, "media_connected", addr="10.0.2.5:5060", latency_ms=300.0),
        agent(10.4, "notify_duplicate", nseq=7, channel="ip"),
        agent(10.5, "notify_duplicate", nseq=8, channel="ip"),
        agent(12, "media_connected", addr="10.0.2.5:5060", latency_ms=50.0),  # not the first
        # A move through a break: the broker dropped 3, the first delivery says so.
        agent(60, "ip_changed", addr="10.0.3.5:5060", prev_addr="10.0.2.5:5060", reason="reattach"),
        agent(60.9, "media_connected", addr="10.0.3.5:5060", latency_ms=900.0),
        agent(61, "notify_gap", nseq=12, channel="ip", missed=3),
        # The broker's copy of a move is not a move; a move with nothing after it.
        broker(90, "ip_changed", addr="10.0.4.5:5060", prev_addr="10.0.3.5:5060"),
        agent(90, "ip_changed", addr="10.0.4.5:5060", prev_addr="10.0.3.5:5060", reason="handover"),
        agent(5, "notify_duplicate", nseq=2, channel="ip"),  # before any move: not charged
    ]
    got = figures.per_move(events(spark, log))
    want = spark.createDataFrame(
        [
            (A, ms(10), "10.0.1.0/24", "10.0.2.0/24", "handover", 300.0, 0, 2),
            (A, ms(60), "10.0.2.0/24", "10.0.3.0/24", "reattach", 900.0, 3, 0),
            (A, ms(90), "10.0.3.0/24", "10.0.4.0/24", "handover", None, 0, 0),
        ],
        S.PER_MOVE_SCHEMA,
    )
    assert_frames_equal(got, want)


def test_per_device_bytes_are_the_devices_and_money_the_brokers(spark: Any) -> None:
    log = [
        broker(1, "notify_delivered", channel="ip", nseq=1, latency_ms=20.0),  # no bytes
        agent(1, "notify_delivered", channel="ip", nseq=1, latency_ms=25.0, bytes=1000),
        agent(2, "notify_delivered", channel="ip", nseq=2, latency_ms=25.0, bytes=500),
        broker(3, "sms_sent", channel="sms", nseq=3, bytes=140, cost=0.05),
        broker(4, "sms_sent", channel="sms", nseq=4, bytes=200, cost=0.1),
        agent(9, "notify_delivered", channel="sms", nseq=3, latency_ms=6000.0, bytes=140),
        agent(3, "notify_delivered", B, channel="ip", nseq=1, latency_ms=30.0, bytes=64),
    ]
    cfg = jobs.JobConfig(ip_cost_per_mb=2.0)
    got = figures.per_device(events(spark, log), cfg)
    want = spark.createDataFrame(
        [
            (A, "ip", 2, 1500, 0.003),
            (A, "sms", 1, 140, 0.15),
            (B, "ip", 1, 64, 0.0001),
        ],
        S.PER_DEVICE_SCHEMA,
    )
    assert_frames_equal(got, want)


def test_end_to_end_latency_is_grouped_by_the_network_the_device_was_on(spark: Any) -> None:
    log = [
        broker(0, "session_started", addr="10.0.1.5:5060"),
        agent(1, "notify_delivered", channel="ip", nseq=1, latency_ms=10.0),
        agent(2, "notify_delivered", channel="ip", nseq=2, latency_ms=30.0),
        broker(2.5, "notify_delivered", channel="ip", nseq=2, latency_ms=999.0),  # not the device's
        agent(3, "ip_changed", addr="100.64.1.9:5060", prev_addr="10.0.1.5:5060"),
        agent(4, "notify_delivered", channel="ip", nseq=3, latency_ms=200.0),
        agent(5, "notify_delivered", channel="sms", nseq=4, latency_ms=8000.0),
    ]
    got = figures.latency_by_network(events(spark, log))
    want = spark.createDataFrame(
        [
            ("ip", "10.0.1.0/24", 2, 20.0, 29.0, 29.8, 20.0),
            ("ip", "100.64.1.0/24", 1, 200.0, 200.0, 200.0, 200.0),
            ("sms", "sms", 1, 8000.0, 8000.0, 8000.0, 8000.0),
        ],
        S.LATENCY_BY_NETWORK_SCHEMA,
    )
    assert_frames_equal(got, want)


def test_a_failover_is_a_session_at_another_broker_while_the_last_never_ended(
    spark: Any,
) -> None:
    log = [
        broker(0, "session_started", node="broker-1"),
        broker(5, "session_reinvited", node="broker-1"),
        broker(9, "session_started", node="broker-2"),  # broker-1's never ended: failover
        broker(12, "session_reinvited", node="broker-2"),
        broker(13, "session_ended", node="broker-2"),
        broker(20, "session_started", node="broker-1"),  # after an end: a new session
        broker(1, "session_started", B, node="broker-2"),
        agent(9, "session_started"),  # the agent's copy: not a broker's
    ]
    got = figures.per_broker(events(spark, log))
    want = spark.createDataFrame(
        [("broker-1", 1, 2, 1, 0), ("broker-2", 2, 2, 1, 1)], S.PER_BROKER_SCHEMA
    )
    assert_frames_equal(got, want)


def test_a_log_without_broker_lines_has_an_empty_broker_table(spark: Any) -> None:
    log = [line(0, "session_started"), agent(1, "session_started")]
    assert figures.per_broker(events(spark, log)).count() == 0


def test_saved_against_always_deliver_now_equals_the_reference(spark: Any, tmp_path: Any) -> None:
    def decided(seconds: float, uri: str, nseq: int, reason: str, cost: float) -> str:
        return broker(seconds, "channel_decided", uri, channel="ip", nseq=nseq, bytes=1000,
                      cost=cost, reason=reason)  # fmt: skip

    wait = "network=cellular class=bulk decision=wait for=wifi until=9 p=0.9 deadline=10"
    log = [
        decided(1, A, 1, wait, 0.5),  # waited, went on Wi-Fi: 0.5 saved, 1000 bytes moved
        decided(10, A, 1, "network=wifi class=bulk decision=deliver", 0.0),
        decided(2, A, 2, "network=cellular class=urgent decision=deliver", 0.2),
        decided(3, A, 3, wait, 0.3),  # waited, its deadline sent it on cellular
        decided(50, A, 3, "network=cellular class=bulk decision=deliver", 0.3),
        decided(4, A, 4, wait, 0.4),  # still held when the log ends: not counted
        agent(4, "channel_decided", nseq=5, reason="network=wifi decision=deliver", cost=9.0),
        # Released in the same millisecond (in order): the wait line still comes first.
        decided(5, B, 1, "network=cellular class=bulk decision=deliver why=in_order", 0.1),
        decided(5, B, 1, wait, 0.1),
    ]
    got = figures.saved(events(spark, list(log)))
    want = spark.createDataFrame(
        [(A, 3, 2, 1000, 1.0, 0.5, 0.5), (B, 1, 1, 0, 0.1, 0.1, 0.0)], S.SAVED_SCHEMA
    )
    assert_frames_equal(got, want)
    (tmp_path / "log.jsonl").write_text("\n".join(log) + "\n")
    oracle = reference.saved(reference.read(tmp_path))
    rows = {r["uri"]: {k: v for k, v in r.asDict().items() if k != "uri"} for r in got.collect()}
    assert rows.keys() == oracle.keys()
    for uri, row in rows.items():
        assert row == pytest.approx(oracle[uri])
