"""The lease table on its own: times in, what is due out (no core, no broker)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.agent.leases import RENEW_FRACTION, RETRY_AFTER, LeaseTable


def test_a_lease_is_due_at_two_thirds_of_its_lifetime_and_once() -> None:
    table = LeaseTable()
    table.grant("7", 100.0, 30.0, fixed=False)
    assert table.deadline(connected=True) == pytest.approx(100.0 + 30.0 * RENEW_FRACTION)
    assert table.take_due(119.9, connected=True).renew == []
    due = table.take_due(120.0, connected=True)
    assert (due.renew, due.lapsed, due.ended) == (["7"], [], [])
    assert table.take_due(125.0, connected=True).renew == []  # on its way: not twice
    assert table.deadline(connected=True) is None
    table.grant("7", 121.0, 30.0, fixed=False)  # the broker's answer
    assert table.deadline(connected=True) == pytest.approx(141.0)


def test_renewals_wait_for_the_connection_and_a_lapsed_lease_is_reported() -> None:
    table = LeaseTable()
    table.grant("7", 0.0, 9.0, fixed=False)
    assert table.deadline(connected=False) is None  # nothing to do offline
    assert table.take_due(6.0, connected=False).renew == []
    due = table.take_due(6.0, connected=True)
    assert due.renew == ["7"]
    table.disconnected()  # the renewal got no answer: the connection went
    assert table.take_due(20.0, connected=False).lapsed == []
    assert table.lapsed("7", 20.0)
    due = table.take_due(20.0, connected=True)
    assert (due.renew, due.lapsed) == ([], ["7"])


def test_a_fixed_lease_ends_at_its_expiry_even_offline() -> None:
    table = LeaseTable()
    table.grant("f", 0.0, 5.0, fixed=True)
    assert table.deadline(connected=False) == 5.0
    assert table.take_due(4.999, connected=True).ended == []
    assert table.take_due(5.0, connected=False).ended == ["f"]
    assert "f" not in table and table.deadline(connected=False) is None


def test_a_failed_renewal_goes_again_before_the_expiry() -> None:
    table = LeaseTable()
    table.grant("7", 0.0, 60.0, fixed=False)
    assert table.take_due(40.0, connected=True).renew == ["7"]
    table.failed("7", 41.0)
    assert table.deadline(connected=True) == 41.0 + RETRY_AFTER
    assert table.take_due(41.0 + RETRY_AFTER, connected=True).renew == ["7"]
    table.failed("7", 59.0)  # a second left: half of it
    assert table.deadline(connected=True) == 59.5
    assert table.take_due(60.0, connected=True).lapsed == ["7"]
    table.failed("7", 60.0)  # lapsed, and subscribing it again failed: not at once
    assert table.take_due(60.0 + RETRY_AFTER - 0.001, connected=True).lapsed == []
    assert table.take_due(60.0 + RETRY_AFTER, connected=True).lapsed == ["7"]


@settings(max_examples=100, deadline=None)
@given(
    lifetime=st.floats(min_value=1.0, max_value=3600.0),
    steps=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=60),
    delays=st.lists(st.floats(min_value=0.0, max_value=0.999), min_size=1, max_size=60),
)
def test_a_lease_answered_in_time_never_lapses(
    lifetime: float, steps: list[float], delays: list[float]
) -> None:
    """Connected, with each renewal answered within the third of the lifetime it leaves,
    at whatever instants the timer fires (late ones too): never lapsed, never early."""
    table = LeaseTable()
    now = 0.0
    table.grant("7", now, lifetime, fixed=False)
    expires = lifetime
    for i, step in enumerate(steps):
        deadline = table.deadline(connected=True)
        assert deadline is not None and deadline < expires  # renewed before its end
        # The timer fires at its deadline or up to a tenth of the slack late.
        now = max(now, deadline + step * lifetime * (1 - RENEW_FRACTION) / 10)
        due = table.take_due(now, connected=True)
        assert due.lapsed == [] and due.ended == []
        assert due.renew == ["7"]
        # The broker's answer comes within the rest of the slack.
        slack = expires - now
        now += delays[i % len(delays)] * slack * 0.9
        table.grant("7", now, lifetime, fixed=False)
        expires = now + lifetime


@settings(max_examples=100, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["advance", "grant", "fail", "drop", "lost", "due"]),
            st.sampled_from(["a", "b", "c"]),
            st.floats(min_value=0.0, max_value=50.0),
            st.booleans(),
        ),
        max_size=80,
    )
)
def test_any_sequence_keeps_the_tables_promises(
    ops: list[tuple[str, str, float, bool]],
) -> None:
    """Whatever happens: a fixed lease ends once, at or after its expiry and never before;
    nothing is renewed or reported lapsed while disconnected; a renewal is never due after
    the expiry it should prevent; ``deadline`` is the earliest instant something is due."""
    table = LeaseTable()
    now = 0.0
    connected = True
    fixed_expiry: dict[str, float] = {}
    for op, sub_id, amount, flag in ops:
        if op == "advance":
            now += amount
        elif op == "grant":
            table.grant(sub_id, now, amount, fixed=flag)
            if flag:
                fixed_expiry[sub_id] = now + amount
            else:
                fixed_expiry.pop(sub_id, None)
        elif op == "fail":
            table.failed(sub_id, now)
        elif op == "drop":
            table.drop(sub_id)
            fixed_expiry.pop(sub_id, None)
        elif op == "lost":
            table.disconnected()
            connected = flag
        deadline = table.deadline(connected=connected)
        for sub_id_, lease in ((s, table.get(s)) for s in "abc"):
            if lease is not None and not lease.fixed:
                # Renewed before its expiry, unless it lapsed (then it waits to retry).
                assert lease.renew_at <= lease.expires or lease.expires <= now
                if not connected or lease.sending:
                    continue
            if lease is not None:
                assert deadline is not None and deadline <= lease.renew_at, sub_id_
        if op == "due" or (deadline is not None and deadline <= now):
            due = table.take_due(now, connected=connected)
            after = table.deadline(connected=connected)
            assert after is None or after > now  # what was due is done: no busy timer
            for ended in due.ended:
                assert fixed_expiry.pop(ended) <= now
            if not connected:
                assert due.renew == [] and due.lapsed == []
            for renewed in due.renew:
                lease = table.get(renewed)
                assert lease is not None and lease.expires > now
    for sub_id, expiry in fixed_expiry.items():
        assert sub_id in table, expiry  # not ended: still there


def test_a_failure_leaves_a_fixed_lease_to_its_end() -> None:
    table = LeaseTable()
    table.grant("f", 0.0, 60.0, fixed=True)
    table.failed("f", 10.0)  # subscribing it again on a new store got no answer
    assert table.deadline(connected=True) == 60.0
    assert table.take_due(59.0, connected=True).ended == []
    assert table.deadline(connected=True) == 60.0
