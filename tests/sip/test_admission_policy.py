"""The sans-IO admission policy of accepted TCP/TLS connections (sip/admission.py), on a
fake clock: caps in total, per source and on pending connections, the displacement of
the heaviest source's oldest pending connection, the three deadlines, and properties
over random event sequences (the total never exceeds its cap, no source its share)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from sip.admission import (
    Admission,
    AdmissionLimits,
    Admit,
    Expired,
    Phase,
    Refuse,
    source_of,
)

LIMITS = AdmissionLimits(
    max_connections=8,
    max_per_source=3,
    max_pending=4,
    handshake_timeout=2.0,
    request_timeout=5.0,
    idle_timeout=60.0,
)


def admitted(decision: Admit | Refuse) -> Admit:
    assert isinstance(decision, Admit), decision
    return decision


def test_sources_are_addresses_and_ipv6_slash_64() -> None:
    assert source_of("192.0.2.7") == "192.0.2.7"
    assert source_of("2001:db8:1:2::1") == source_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_of("2001:db8:1:3::1") != source_of("2001:db8:1:2::1")
    assert source_of("2001:db8:1:2::1", 48) == "2001:db8:1::/48"
    assert source_of("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_of("fe80::1%eth0") == "fe80::/64"


def test_a_source_is_refused_past_its_share_and_others_still_get_in() -> None:
    policy = Admission(LIMITS)
    for _ in range(3):
        admitted(policy.admit("10.0.0.1", 0.0, tls=False))
    assert policy.admit("10.0.0.1", 0.0, tls=False) == Refuse("10.0.0.1", "source-share")
    assert admitted(policy.admit("10.0.0.2", 0.0, tls=False)).evicted == ()
    assert policy.count("10.0.0.1") == 3 and policy.total == 4


def test_a_fresh_source_displaces_the_oldest_pending_connection_of_the_heaviest() -> None:
    policy = Admission(LIMITS)
    a = [admitted(policy.admit("10.0.0.1", float(t), tls=True)).conn for t in range(3)]
    b = admitted(policy.admit("10.0.0.2", 3.0, tls=True)).conn
    assert policy.pending == 4  # the pending cap
    # 10.0.0.1 holds more pending connections than 10.0.0.2: its oldest makes room.
    assert admitted(policy.admit("10.0.0.2", 3.0, tls=True)).evicted == (a[0],)
    # Now both hold two: no displacement between equals.
    assert policy.admit("10.0.0.2", 3.0, tls=True) == Refuse("10.0.0.2", "pending")
    # A fresh source displaces the oldest connection among the heaviest sources.
    fresh = admitted(policy.admit("10.0.0.3", 3.0, tls=True))
    assert fresh.evicted == (a[1],)
    assert policy.phase(a[0]) is None and policy.phase(a[1]) is None
    assert policy.phase(a[2]) is Phase.HANDSHAKE and policy.phase(b) is Phase.HANDSHAKE
    assert policy.pending == 4 and policy.count("10.0.0.1") == 1


def test_established_connections_are_never_displaced() -> None:
    limits = AdmissionLimits(max_connections=4, max_per_source=4, max_pending=4)
    policy = Admission(limits)
    for _ in range(4):
        conn = admitted(policy.admit("10.0.0.1", 0.0, tls=False)).conn
        policy.message_seen(conn, 0.0)
    assert policy.pending == 0
    assert policy.admit("10.0.0.2", 0.0, tls=False) == Refuse("10.0.0.2", "total")


def test_deadlines_by_phase() -> None:
    policy = Admission(LIMITS)
    silent = admitted(policy.admit("10.0.0.1", 0.0, tls=True)).conn
    shaken = admitted(policy.admit("10.0.0.2", 0.0, tls=True)).conn
    talker = admitted(policy.admit("10.0.0.3", 0.0, tls=False)).conn
    assert policy.next_deadline() == 2.0
    policy.handshake_done(shaken, 1.0)
    policy.message_seen(talker, 1.0)
    # A byte every second keeps an established connection, and does not keep a pending one.
    for t in range(2, 7):
        policy.activity(shaken, float(t))
        policy.activity(talker, float(t))
        if t == 2:
            assert policy.expire(2.0) == [Expired(silent, Phase.HANDSHAKE)]
    assert policy.expire(5.99) == []
    assert policy.expire(6.0) == [Expired(shaken, Phase.REQUEST)]
    assert policy.expire(65.9) == []
    assert policy.expire(66.0) == [Expired(talker, Phase.ESTABLISHED)]
    assert policy.total == 0 and policy.pending == 0 and policy.next_deadline() is None


def test_the_first_request_never_waits_longer_than_the_idle_timeout() -> None:
    policy = Admission(AdmissionLimits(request_timeout=10.0, idle_timeout=0.5))
    conn = admitted(policy.admit("10.0.0.1", 0.0, tls=False)).conn
    assert policy.expire(0.5) == [Expired(conn, Phase.REQUEST)]


def test_released_connections_do_not_grow_the_deadline_heap() -> None:
    policy = Admission(LIMITS)
    for i in range(10_000):
        conn = admitted(policy.admit(f"10.0.{i % 200}.1", float(i), tls=False)).conn
        policy.release(conn)
    assert policy.total == 0
    assert policy.next_deadline() is None
    assert policy.scheduled <= 64 + 1  # the bound the rebuild keeps


# --------------------------------------------------------------------- properties


@dataclass(frozen=True)
class Op:
    kind: str  # admit, handshake, message, activity, release, tick
    source: int
    tls: bool
    pick: int
    dt: float


OPS = st.builds(
    Op,
    kind=st.sampled_from(["admit", "admit", "admit", "handshake", "message", "activity",
                          "release", "tick"]),
    source=st.integers(0, 6),
    tls=st.booleans(),
    pick=st.integers(0, 50),
    dt=st.floats(0.0, 4.0, allow_nan=False),
)  # fmt: skip

LIMITS_ST = st.builds(
    AdmissionLimits,
    max_connections=st.integers(1, 12),
    max_per_source=st.integers(1, 6),
    max_pending=st.integers(1, 8),
    handshake_timeout=st.floats(0.5, 5.0),
    request_timeout=st.floats(0.5, 8.0),
    idle_timeout=st.floats(0.5, 20.0),
)


@settings(max_examples=300, deadline=None)
@given(limits=LIMITS_ST, ops=st.lists(OPS, max_size=120))
def test_caps_hold_and_deadlines_are_kept_for_any_event_sequence(
    limits: AdmissionLimits, ops: list[Op]
) -> None:
    policy = Admission(limits)
    now = 0.0
    live: dict[int, str] = {}  # the model: conn -> source
    deadline: dict[int, float] = {}
    phase: dict[int, Phase] = {}
    for op in ops:
        host = f"10.0.0.{op.source}"
        ids = sorted(live)
        conn = ids[op.pick % len(ids)] if ids else -1
        if op.kind == "admit":
            pending_sources = {live[c] for c in live if phase[c] is not Phase.ESTABLISHED}
            decision = policy.admit(host, now, tls=op.tls)
            if isinstance(decision, Refuse):
                # A fresh source is refused only when nothing pending can make room.
                if decision.reason != "source-share" and policy.count(host) == 0:
                    assert not pending_sources
            else:
                for victim in decision.evicted:
                    assert phase[victim] is not Phase.ESTABLISHED
                    del live[victim], deadline[victim], phase[victim]
                live[decision.conn] = host
                phase[decision.conn] = Phase.HANDSHAKE if op.tls else Phase.REQUEST
                first = limits.handshake_timeout if op.tls else limits.first_request_timeout
                deadline[decision.conn] = now + first
        elif op.kind == "handshake" and conn >= 0:
            policy.handshake_done(conn, now)
            if phase[conn] is Phase.HANDSHAKE:
                phase[conn] = Phase.REQUEST
                deadline[conn] = now + limits.first_request_timeout
        elif op.kind == "message" and conn >= 0:
            policy.message_seen(conn, now)
            phase[conn] = Phase.ESTABLISHED
            deadline[conn] = now + limits.idle_timeout
        elif op.kind == "activity" and conn >= 0:
            policy.activity(conn, now)
            if phase[conn] is Phase.ESTABLISHED:
                deadline[conn] = now + limits.idle_timeout
        elif op.kind == "release" and conn >= 0:
            policy.release(conn)
            del live[conn], deadline[conn], phase[conn]
        elif op.kind == "tick":
            now += op.dt
            gone = {e.conn: e.phase for e in policy.expire(now)}
            assert gone == {c: phase[c] for c in live if deadline[c] <= now}
            for c in gone:
                del live[c], deadline[c], phase[c]
        # The caps, and the policy's counts agree with the model.
        assert policy.total == len(live) <= limits.max_connections
        pending = [c for c in live if phase[c] is not Phase.ESTABLISHED]
        assert policy.pending == len(pending) <= limits.pending_cap
        for src in set(live.values()):
            assert policy.count(src) == sum(1 for s in live.values() if s == src)
            assert policy.count(src) <= limits.share
        assert all(policy.phase(c) is phase[c] for c in live)
        nxt = policy.next_deadline()
        assert nxt is None if not live else nxt is not None and nxt <= min(deadline.values())
