"""Every churn job on tiny hand-made logs whose answers are worked out by hand.

Each test writes the lines a broker would, shuffled where order must not matter, and
compares the job's frame with the expected one (``assertDataFrameEqual``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from analytics import jobs, parse, recommend
from analytics import schema as S
from tests.analytics.logs import T0_MS, assert_frames_equal, line, ms

pytestmark = pytest.mark.peer("spark")

A = "sip:alice@example.net"
B = "sip:bob@example.net"
C = "sip:carol@example.net"


def parsed(spark: Any, lines: list[str], keep_extra: bool = False) -> Any:
    df = spark.createDataFrame([(x, "test.jsonl") for x in lines], "value string, source string")
    return parse.parse_lines(df, keep_extra=keep_extra)


def events(spark: Any, lines: list[str], keep_extra: bool = False) -> Any:
    return parse.valid_events(parsed(spark, lines, keep_extra))


def frame(spark: Any, rows: list[tuple[Any, ...]], schema: Any) -> Any:
    return spark.createDataFrame(rows, schema)


def assert_equal(actual: Any, expected: Any) -> None:
    assert_frames_equal(actual, expected)


# ----------------------------------------------------------------------- parsing


def test_invalid_lines_are_quarantined_with_a_reason_and_never_fatal(spark: Any) -> None:
    good = line(1, "registered", addr="10.0.0.1:5060")
    lines = [
        good,
        good,  # an exact duplicate: dropped once, not quarantined
        good[:30],  # truncated mid-object
        "[1, 2]",  # JSON, but not an object
        "   ",  # blank: not a record, not counted
        json.dumps({"ts": "2024-05-06T10:00:01.000Z", "event": "registered"}),
        json.dumps({"ts": "last tuesday", "event": "registered", "uri": A}),
        json.dumps({"event": "registered", "uri": A}),
        json.dumps({"ts": "2024-05-06T10:00:01.000Z", "event": "teleported", "uri": A}),
        json.dumps(
            {"ts": "2024-05-06T10:00:01.000Z", "event": "notify_queued", "uri": A, "nseq": "x"}
        ),
        json.dumps({"ts": "2024-05-06T10:00:01.000Z", "uri": A}),
    ]
    p = parsed(spark, lines)
    q = parse.quarantine(p)
    expected = frame(
        spark,
        [
            (lines[2], "not a JSON object with the churn-log field types", "test.jsonl"),
            (lines[3], "not a JSON object with the churn-log field types", "test.jsonl"),
            (lines[5], "missing uri", "test.jsonl"),
            (lines[6], "ts is not an RFC 3339 time", "test.jsonl"),
            (lines[7], "missing ts", "test.jsonl"),
            (lines[8], "unknown event", "test.jsonl"),
            (lines[9], "not a JSON object with the churn-log field types", "test.jsonl"),
            (lines[10], "missing event", "test.jsonl"),
        ],
        S.QUARANTINE_SCHEMA,
    )
    assert_equal(q, expected)
    ev = parse.valid_events(p).collect()
    assert len(ev) == 1
    assert ev[0]["ts_ms"] == ms(1)
    assert ev[0]["addr"] == "10.0.0.1:5060"


def test_unknown_fields_are_kept_as_text(spark: Any) -> None:
    lines = [line(2, "ip_changed", addr="10.0.0.2:1", zone="eu-1", hops=3, geo={"lat": 1.5})]
    row = events(spark, lines, keep_extra=True).collect()[0]
    assert json.loads(row["extra"]) == {"zone": "eu-1", "hops": "3", "geo": '{"lat":1.5}'}
    assert row["addr"] == "10.0.0.2:1"
    # Without keep_extra the same line is just as valid; the unknown fields are skipped.
    row = events(spark, lines).collect()[0]
    assert (row["addr"], row["extra"]) == ("10.0.0.2:1", None)


def test_parquet_records_parse_like_lines(spark: Any) -> None:
    df = spark.createDataFrame(
        [("2024-05-06T10:00:01.000Z", "registered", A, "x"), (None, "registered", A, "y")],
        "ts string, event string, uri string, colour string",
    )
    p = parse.parse_records(df)
    ev = parse.valid_events(p).collect()
    assert [(r["uri"], r["ts_ms"], r["extra"]) for r in ev] == [(A, ms(1), '{"colour":"x"}')]
    assert [r["reason"] for r in parse.quarantine(p).collect()] == ["missing ts"]


# ----------------------------------------------------------------------- episodes


def _episode_log() -> list[str]:
    # Alice: a break from 10 s to 70 s with a second (overlapping) disconnect at 20 s,
    # a connect with no break at 80 s, then a break from 100 s that never ends.
    # Bob: a connect with no break, then a disconnect and a connect in the same
    # millisecond at 50 s, written connect first. Carol's line at 200 s ends the log.
    lines = [
        line(70, "media_connected", A, latency_ms=300.0),
        line(10, "media_disconnected", A),
        line(20, "media_disconnected", A, reason="again"),
        line(80, "media_connected", A, latency_ms=100.0),
        line(100, "media_disconnected", A),
        line(5, "media_connected", B, latency_ms=50.0),
        line(50, "media_connected", B, latency_ms=20.0),
        line(50, "media_disconnected", B),
        line(200, "registered", C),
    ]
    return lines


def test_episodes_over_the_whole_log(spark: Any) -> None:
    eps = jobs.episodes(events(spark, _episode_log()), jobs.TimeWindow())
    expected = frame(
        spark,
        [
            (A, ms(10), ms(70), ms(10), ms(70), 60_000, False),
            (A, ms(100), None, ms(100), ms(200), 100_000, True),
            (B, ms(50), ms(50), ms(50), ms(50), 0, False),
        ],
        S.EPISODE_SCHEMA,
    )
    assert_equal(eps, expected)


def test_episodes_given_the_last_instant_need_no_scan_of_every_event(spark: Any) -> None:
    """With the log's last instant known (``churn`` has it from the events' own job), the
    episodes are the same rows of the same schema, and their plan aggregates nothing
    over the events: without it, the end of an open episode would take a scan of every
    event."""
    ev = events(spark, _episode_log())
    window = jobs.TimeWindow()
    scanned = jobs.episodes(ev, window)
    given = jobs.episodes(ev, window, last_ms=ms(200))
    assert_equal(given, scanned)
    assert given.schema == scanned.schema
    plan = given._jdf.queryExecution().optimizedPlan().toString()
    assert "max(" not in plan and "Join" not in plan, plan
    assert "max(" in scanned._jdf.queryExecution().optimizedPlan().toString()


def test_episodes_are_clipped_at_the_edges_of_the_window(spark: Any) -> None:
    window = jobs.TimeWindow(since_ms=ms(30), until_ms=ms(150))
    eps = jobs.episodes(events(spark, _episode_log()), window)
    expected = frame(
        spark,
        [
            (A, ms(10), ms(70), ms(30), ms(70), 40_000, False),  # began before since
            (A, ms(100), None, ms(100), ms(150), 50_000, True),  # still open at until
            (B, ms(50), ms(50), ms(50), ms(50), 0, False),
        ],
        S.EPISODE_SCHEMA,
    )
    assert_equal(eps, expected)


def test_episodes_touching_the_window_edges(spark: Any) -> None:
    ev = events(spark, _episode_log())
    # Ending exactly at since: nothing of it is inside the window.
    after = jobs.episodes(ev, jobs.TimeWindow(since_ms=ms(70)))
    assert sorted((r["uri"], r["start_ms"]) for r in after.collect()) == [(A, ms(100))]
    # Beginning exactly at until: outside; the window is half-open.
    before = jobs.episodes(ev, jobs.TimeWindow(until_ms=ms(50)))
    rows = sorted((r["uri"], r["start_ms"], r["duration_ms"]) for r in before.collect())
    assert rows == [(A, ms(10), 40_000)]  # clipped at until


def test_the_tear_down_of_an_ended_session_is_no_episode_in_either_order(spark: Any) -> None:
    """The broker's database thread logs the tear-down (``media_disconnected``, reason
    ``session ended``) before ``session_ended``; the old order was the reverse. Neither
    is an outage (the demo's logs counted 3 disconnections instead of 1)."""
    log = [
        line(0, "media_connected", A, latency_ms=10.0),
        line(10, "media_disconnected", A, reason="session ended"),
        line(11, "session_ended", A),
        line(0, "media_connected", B, latency_ms=10.0),
        line(10, "session_ended", B),
        line(11, "media_disconnected", B, reason="session ended"),
        line(0, "media_connected", C, latency_ms=10.0),
        line(10, "media_disconnected", C, reason="rudp: no ACK after retries"),
        line(11, "session_ended", C),
    ]
    eps = jobs.episodes(events(spark, log), jobs.TimeWindow())
    assert [(r["uri"], r["start_ms"], r["end_ms"]) for r in eps.collect()] == [
        (C, ms(10), ms(11))  # an outage that the session's end closed
    ]


def test_a_broker_the_agent_lost_is_an_episode_and_one_with_the_brokers_own(spark: Any) -> None:
    """A killed broker logs nothing: alice's agent's ``broker_lost`` opens the episode,
    and the restarted broker's ``media_connected`` ends it. Bob's outage is logged by
    both sides: one episode, from the first of the two lines."""
    log = [
        line(0, "media_connected", A, latency_ms=10.0),
        line(10, "broker_lost", A, role="agent", reason="rudp: dead"),
        line(10, "media_disconnected", A, role="agent", reason="rudp: dead"),  # a copy
        line(30, "media_connected", A, role="broker"),
        line(0, "media_connected", B, latency_ms=10.0),
        line(12, "broker_lost", B, role="agent"),
        line(14, "media_disconnected", B, role="broker"),
        line(20, "media_connected", B, role="broker"),
        line(25, "broker_lost", C, role="broker"),  # not the broker's fact: no episode
    ]
    eps = jobs.episodes(events(spark, log), jobs.TimeWindow())
    assert sorted((r["uri"], r["start_ms"], r["end_ms"]) for r in eps.collect()) == [
        (A, ms(10), ms(30)),
        (B, ms(12), ms(20)),
    ]


# ----------------------------------------------------------------------- per user


def _user_log() -> list[str]:
    return [
        line(0, "registered", A, addr="10.0.1.5:5060"),
        line(0.003, "session_started", A, call_id="c1"),
        line(0.3, "media_connected", A, latency_ms=300.0),
        line(600, "ip_changed", A, addr="10.0.2.9:5060", prev_addr="10.0.1.5:5060"),
        line(600.004, "session_reinvited", A, call_id="c1"),
        line(600.1, "media_connected", A, latency_ms=100.0),
        line(900, "notify_queued", A, nseq=1, queue_depth=1),
        line(900.05, "notify_delivered", A, nseq=1, queue_depth=0, latency_ms=50.0),
        line(1000, "media_disconnected", A),
        line(1010, "notify_queued", A, nseq=2, queue_depth=1),
        line(1011, "sms_sent", A, channel="sms", nseq=2, bytes=100, cost=0.05),
        line(1020, "notify_dropped", A, queue_depth=1, reason="queue_full"),
        line(1030, "sms_sent", A, channel="sms", nseq=3, bytes=300, cost=0.1),
        line(1600, "ip_changed", A, addr="10.0.3.1:5060", prev_addr="10.0.2.9:5060"),
        line(1600.2, "media_connected", A, latency_ms=200.0),
        line(1600.4, "media_connected", A, latency_ms=400.0),
        line(1600.5, "notify_delivered", A, nseq=2, queue_depth=0, latency_ms=590500.0),
        line(30, "registered", B),
    ]


def test_per_user_counts_and_percentiles(spark: Any) -> None:
    ev = events(spark, _user_log())
    window = jobs.TimeWindow()
    eps = jobs.episodes(ev, window)
    got = jobs.per_user(jobs.in_window(ev, window), eps)
    # Restore latencies 100, 200, 300, 400: p50 = 250; p95 = 385; p99 = 397 (linear).
    # One break of 600.2 s -> churn 2 + 2*1 + 10.003/10 + 5*1 = 10.000 (3 decimals).
    expected = frame(
        spark,
        [
            (A, 17, 2, 1, 1, 600_200, 600_200, 4, 250.0, 385.0, 397.0, 1, 2, 2, 1, 2, 0.15, 10.0),
            (B, 1, 0, 0, 0, 0, 0, 0, None, None, None, 0, 0, 0, 0, 0, 0.0, 0.0),
        ],
        S.PER_USER_SCHEMA,
    )
    assert_equal(got, expected)


def test_per_user_counts_only_the_window_and_out_of_order_lines(spark: Any) -> None:
    lines = list(reversed(_user_log()))
    ev = events(spark, lines)
    window = jobs.TimeWindow(since_ms=ms(1000), until_ms=ms(1600.2))
    eps = jobs.episodes(ev, window)
    got = jobs.per_user(jobs.in_window(ev, window), eps)
    # Break clipped to [1000, 1600.2): 600.2 s; churn 1 + 2 + 600.2/600 + 5 = 9.000333.
    expected = frame(
        spark,
        [(A, 6, 1, 0, 1, 600_200, 600_200, 0, None, None, None, 0, 1, 0, 1, 2, 0.15, 9.0)],
        S.PER_USER_SCHEMA,
    )
    assert_equal(got, expected)


def test_per_user_counts_in_a_compiled_aggregate_and_percentiles_over_restores_only(
    spark: Any,
) -> None:
    """The counts of every event are a (compiled, hashed) aggregate of their own: next to
    the exact percentiles, an object aggregate, Spark sorted every event of the log by user
    past 128 users per task."""
    ev = events(spark, _user_log())
    window = jobs.TimeWindow()
    got = jobs.per_user(jobs.in_window(ev, window), jobs.episodes(ev, window))
    plan = got._jdf.queryExecution().executedPlan().toString()
    objects = [row for row in plan.splitlines() if "ObjectHashAggregate" in row]
    assert objects, plan
    for row in objects:
        assert "percentile" in row and "session_reinvited" not in row, row


# ----------------------------------------------------------------------- per hour


def test_per_hour(spark: Any) -> None:
    lines = [
        line(-60, "media_disconnected", A),  # 09:59, before the window: not counted
        line(10, "media_connected", A, latency_ms=1.0),
        line(20, "ip_changed", A, addr="10.0.0.2:1", prev_addr="10.0.0.1:1"),
        line(25, "session_reinvited", A),
        line(30, "ip_changed", B, addr="10.0.0.3:1", prev_addr="10.0.0.1:1"),
        line(40, "sms_sent", B, cost=0.25),
        line(3599.999, "media_disconnected", B),  # last millisecond of 10:00
        line(3600, "media_connected", B, latency_ms=1.0),  # first of 11:00
        line(3700, "notify_dropped", C),
        line(3800, "media_disconnected", C),
        line(3800, "media_disconnected", C, reason="duplicate report"),
    ]
    ev = events(spark, lines)
    window = jobs.TimeWindow(since_ms=T0_MS)
    eps = jobs.episodes(ev, window)
    got = jobs.per_hour(jobs.in_window(ev, window), eps, window)
    h10 = datetime(2024, 5, 6, 10, 0, tzinfo=UTC)
    h11 = datetime(2024, 5, 6, 11, 0, tzinfo=UTC)
    expected = frame(
        spark,
        [(h10, 2, 6, 2, 1, 1, 0, 1, 0.25), (h11, 2, 4, 0, 0, 1, 1, 0, 0.0)],
        S.PER_HOUR_SCHEMA,
    )
    assert_equal(got, expected)


# ----------------------------------------------------------------- graph, CDF, detectors


def test_transitions_between_subnets(spark: Any) -> None:
    lines = [
        line(1, "ip_changed", A, addr="10.0.2.7:5060", prev_addr="10.0.1.5:5060"),
        line(2, "ip_changed", B, addr="10.0.2.8:5062", prev_addr="10.0.1.9:5060"),
        line(3, "ip_changed", A, addr="10.0.2.9:5060", prev_addr="10.0.1.5:5060"),
        line(4, "ip_changed", A, addr="[2001:db8::1]:5060", prev_addr="10.0.2.9:5060"),
        line(5, "ip_changed", C, addr="10.0.2.7:5060"),  # no previous address: no edge
    ]
    got = jobs.transitions(events(spark, lines))
    expected = frame(
        spark,
        [("10.0.1.0/24", "10.0.2.0/24", 3, 2), ("10.0.2.0/24", "2001:db8::1", 1, 1)],
        S.TRANSITION_SCHEMA,
    )
    assert_equal(got, expected)


def test_restore_latency_histogram_and_cdf(spark: Any) -> None:
    lines = [
        line(1, "media_connected", A, latency_ms=10.0),
        line(2, "media_connected", A, latency_ms=60.0),
        line(3, "media_connected", B, latency_ms=99.9),
        line(4, "media_connected", B, latency_ms=20000.0),
        line(5, "media_connected", C),  # no latency: not a measured restore
        line(6, "notify_delivered", C, latency_ms=70.0),  # not a restore
    ]
    got = jobs.restore_latency(events(spark, lines), jobs.JobConfig())
    expected = frame(
        spark,
        [(0.0, 50.0, 1, 0.25), (50.0, 100.0, 2, 0.75), (10000.0, None, 1, 1.0)],
        S.LATENCY_SCHEMA,
    )
    assert_equal(got, expected)


def test_flapping(spark: Any) -> None:
    def change(t: float, uri: str) -> str:
        return line(t, "ip_changed", uri, addr="10.0.0.2:1", prev_addr="10.0.0.1:1")

    lines = [change(t, A) for t in (0, 30, 60, 90, 120, 400, 1000)]
    lines += [change(t, B) for t in (0, 10, 20, 30)]  # four: below the threshold
    got = jobs.flapping(events(spark, lines), jobs.JobConfig())
    expected = frame(spark, [(A, ms(0), ms(120), 5, 5)], S.FLAPPING_SCHEMA)
    assert_equal(got, expected)


def test_reconnect_storms(spark: Any) -> None:
    base = 600  # 10:10:00, a bucket edge
    users = [f"sip:u{i}@example.net" for i in range(12)]
    lines = [line(base + i, "media_connected", u, latency_ms=1.0) for i, u in enumerate(users[:10])]
    lines += [
        line(base + 60 + i, "media_connected", u, latency_ms=1.0) for i, u in enumerate(users[4:12])
    ]
    lines += [
        line(base + 300 + i, "media_connected", u, latency_ms=1.0) for i, u in enumerate(users[:3])
    ]
    # An hour later, rush hour: 9 users restore in every minute of the hour. That is the
    # baseline (9 per bucket), so a minute of 20 users is below 4 x 9 and no storm.
    busy = 2 * 3600
    lines += [
        line(busy + 60 * m + i, "media_connected", f"sip:r{m}.{i}@example.net", latency_ms=1.0)
        for m in range(60)
        for i in range(20 if m == 30 else 9)
    ]
    got = jobs.storms(events(spark, lines), jobs.JobConfig(storm_min_users=8))
    expected = frame(spark, [(ms(base), ms(base + 120), 12, 18)], S.STORM_SCHEMA)
    assert_equal(got, expected)


def test_recommendations(spark: Any) -> None:
    lines = [
        line(1, "notify_delivered", A, channel="ip", latency_ms=10.0),
        line(2, "notify_delivered", A, channel="ip", latency_ms=20.0),
        line(3, "notify_delivered", A, channel="ip", latency_ms=30.0),
        line(4, "notify_delivered", A, channel="ip", latency_ms=40.0),
        line(5, "notify_delivered", A, channel="ip", latency_ms=5000.0),  # held: not live
        line(10, "media_disconnected", A),
        line(11, "notify_queued", A, queue_depth=1),
        line(12, "notify_queued", A, queue_depth=2),
        line(12.5, "notify_queued", A, queue_depth=3),
        line(12.6, "notify_dropped", A, queue_depth=3),
        line(12.7, "notify_dropped", A, queue_depth=3),
        line(13, "media_connected", A, latency_ms=5.0),
        line(20, "media_disconnected", B),
        line(21, "notify_queued", B, queue_depth=4),
        line(21, "media_connected", B, latency_ms=5.0),
    ]
    ev = events(spark, lines)
    eps = jobs.episodes(ev, jobs.TimeWindow())
    got = recommend.recommendations(ev, eps, jobs.JobConfig(min_tail_observations=0))
    values = {r["setting"]: r["value"] for r in got.collect()}
    # Live p99 = 39.7 ms -> 2x = 79.4 -> 100 -> at least 200 ms. Short breaks 3 s and 1 s:
    # p90 = 2.8 s -> retries = ceil(log2(2800/200 + 1)) = 4; give-up 200 * 15 = 3000 ms.
    # p99 of breaks 2.98 s * 1.5 -> 5 minutes -> at least 600 s. Queue: 3 + 2 drops = 5.
    assert values == {
        "rudp_initial_rto_ms": 200.0,
        "rudp_max_retries": 4.0,
        "rudp_give_up_after_ms": 3000.0,
        "subscription_ttl_s": 600.0,
        "queue_max_per_uri": 5.0,
    }
    assert got.schema.simpleString() == S.RECOMMENDATION_SCHEMA.simpleString()
    # Four live deliveries hold a p99 with 0.04 observations above it, not with 0.05;
    # the retries need the timeout's sample as well as the disconnections'.
    enough = _recommended(ev, eps, jobs.JobConfig(min_tail_observations=0.04))
    short = _recommended(ev, eps, jobs.JobConfig(min_tail_observations=0.05))
    assert enough["rudp_initial_rto_ms"][0] == 200.0
    assert enough["rudp_max_retries"][0] == 4.0
    assert short["rudp_initial_rto_ms"] == (None, "not enough data: 4 live deliveries, 5 needed")
    assert short["rudp_max_retries"] == short["rudp_initial_rto_ms"]


def _recommended(ev: Any, eps: Any, cfg: jobs.JobConfig) -> dict[str, tuple[float | None, str]]:
    return {
        r["setting"]: (r["value"], r["basis"])
        for r in recommend.recommendations(ev, eps, cfg).collect()
    }


def test_a_small_log_gets_no_recommendation_but_the_sample_it_lacks(spark: Any) -> None:
    lines = [line(i, "notify_delivered", A, channel="ip", latency_ms=10.0) for i in range(50)]
    ev = events(spark, [*lines, line(60, "media_disconnected", A), line(61, "media_connected", A)])
    eps = jobs.episodes(ev, jobs.TimeWindow())
    got = _recommended(ev, eps, jobs.JobConfig())
    assert got == {
        "rudp_initial_rto_ms": (None, "not enough data: 50 live deliveries, 1,000 needed"),
        "rudp_max_retries": (None, "not enough data: 50 live deliveries, 1,000 needed"),
        "rudp_give_up_after_ms": (None, "not enough data for the timeout or the retries"),
        "subscription_ttl_s": (None, "not enough data: 1 disconnections, 1,000 needed"),
        "queue_max_per_uri": (None, "not enough data: 1 stretches between restores, 100 needed"),
    }


def test_recommendations_without_data_are_null_not_errors(spark: Any) -> None:
    ev = events(spark, [line(1, "registered", A)])
    eps = jobs.episodes(ev, jobs.TimeWindow())
    got = _recommended(ev, eps, jobs.JobConfig(min_tail_observations=0))
    assert {setting: value for setting, (value, _) in got.items()} == dict.fromkeys(got)
    assert len(got) == 5
    assert got["rudp_initial_rto_ms"][1] == "not enough data: 0 live deliveries, 1 needed"
