"""The login throttle and the failed-login log rate, sans-IO on a fake monotonic clock:
examples of each rule, then properties over random histories."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.broker.login_log import LoginLog
from mdeci.broker.throttle import LoginThrottle, ThrottleConfig, source_key
from mdeci.errors import ConfigError

SMALL = ThrottleConfig(max_failures=2, window=60, lockout=10, max_lockout=40, max_keys=4)


def test_locks_double_up_to_the_cap_and_are_forgotten_when_quiet() -> None:
    throttle = LoginThrottle(SMALL)
    assert not throttle.failed("u", "10.0.0.1", 0.0, known_user=True)
    assert throttle.failed("u", "10.0.0.1", 1.0, known_user=True) == "user and source"
    assert throttle.retry_after("v", "10.0.0.1", 2.0) == pytest.approx(9.0)  # the source
    throttle.failed("u", "10.0.0.2", 12.0, known_user=True)
    assert throttle.failed("u", "10.0.0.2", 13.0, known_user=True)
    assert throttle.retry_after("u", "10.0.0.2", 14.0) == pytest.approx(19.0)  # doubled
    throttle.failed("u", "10.0.0.3", 40.0, known_user=True)
    throttle.failed("u", "10.0.0.3", 41.0, known_user=True)
    assert throttle.retry_after("u", "10.0.0.3", 41.0) == pytest.approx(40.0)  # capped
    # Quiet for max_lockout after the lock: the next lock is the first length again.
    later = 81.0 + 41.0
    throttle.failed("u", "10.0.0.4", later, known_user=True)
    throttle.failed("u", "10.0.0.4", later + 1, known_user=True)
    assert throttle.retry_after("u", "10.0.0.4", later + 1) == pytest.approx(10.0)


def test_a_locked_user_passes_from_a_clean_source_only() -> None:
    throttle = LoginThrottle(SMALL)
    for t in (0.0, 1.0):
        throttle.failed("bob", "10.0.0.66", t, known_user=True)
    assert throttle.retry_after("bob", "10.0.0.66", 2.0) is not None
    assert throttle.retry_after("bob", "192.0.2.1", 2.0) is None  # clean: checked
    throttle.failed("bob", "192.0.2.1", 2.0, known_user=True)  # its one guess
    assert throttle.retry_after("bob", "192.0.2.1", 3.0) is not None
    throttle.succeeded("bob")  # the owner, from yet another clean source
    assert throttle.retry_after("bob", "10.0.0.66", 3.0) is not None  # the lock stands


def test_unknown_users_make_no_entry() -> None:
    throttle = LoginThrottle(SMALL)
    for i in range(100):
        throttle.failed(f"random{i}", f"10.1.0.{i}", 0.0, known_user=False)
    assert throttle.sizes == (SMALL.max_keys, 0)  # only the source table fills
    throttle.failed("random", "10.1.1.1", 1.0, known_user=False)
    assert throttle.failed("random", "10.1.1.1", 2.0, known_user=False) == "source"


def test_a_table_full_of_live_locks_refuses_new_keys_and_no_new_source_is_clean() -> None:
    throttle = LoginThrottle(SMALL)
    for i in range(4):
        for t in (0.0, 1.0):
            throttle.failed(None, f"10.2.0.{i}", t, known_user=False)
    throttle.failed("bob", "10.2.0.0", 0.5, known_user=True)
    throttle.failed("bob", "10.2.0.1", 0.7, known_user=True)
    assert throttle.retry_after("bob", "10.2.0.9", 2.0) is not None  # no source is clean
    throttle.failed(None, "10.2.0.9", 2.0, known_user=False)
    assert throttle.untracked == 1
    assert all(throttle.retry_after(None, f"10.2.0.{i}", 2.0) for i in range(4))
    # Once the locks end, their entries make room again.
    assert throttle.retry_after("bob", "10.2.0.9", 50.0) is None


def test_source_keys_ignore_the_port_and_the_host_part_of_an_ipv6_64() -> None:
    assert source_key("192.0.2.7") == "192.0.2.7"
    assert source_key("[2001:db8:1:2::1]") == source_key("2001:db8:1:2:ffff::9")
    assert source_key("2001:db8:1:3::1") != source_key("2001:db8:1:2::1")
    assert source_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_key("Host.Example") == "host.example"


def test_bad_throttle_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="max_lockout"):
        ThrottleConfig(lockout=100, max_lockout=10)
    with pytest.raises(ConfigError, match="max_keys"):
        ThrottleConfig(max_keys=0)


# ------------------------------------------------------------------ properties

hosts = st.integers(0, 40).map(lambda i: f"10.9.0.{i}")
users = st.sampled_from(["alice", "bob", "carol", "dave", "erin", "frank"])
steps = st.lists(
    st.tuples(users, hosts, st.floats(0.0, 20.0), st.booleans()), min_size=1, max_size=200
)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_memory_is_bounded_and_a_live_lock_is_never_dropped(
    history: list[tuple[str, str, float, bool]],
) -> None:
    throttle = LoginThrottle(SMALL)
    now = 0.0
    user_locks: dict[str, float] = {}  # the user's lock as it was made
    for user, host, gap, known in history:
        now += gap
        throttle.failed(user, host, now, known_user=known)
        until = throttle.user_locked_until(user, now)
        if until is not None:
            user_locks[user] = max(user_locks.get(user, 0.0), until)
        assert max(throttle.sizes) <= SMALL.max_keys
        for name, until in user_locks.items():
            if until > now:
                held = throttle.user_locked_until(name, now)
                assert held is not None and held >= until


@settings(max_examples=150, deadline=None)
@given(steps, users)
def test_a_user_from_a_source_that_never_failed_is_checked(
    history: list[tuple[str, str, float, bool]], victim: str
) -> None:
    """Whatever others did, the owner's own clean address reaches the password check,
    unless the source table is full of live locks (then nobody is clean)."""
    throttle = LoginThrottle(ThrottleConfig(max_failures=2, lockout=10, max_keys=64))
    now = 0.0
    for user, host, gap, known in history:
        now += gap
        throttle.failed(user, host, now, known_user=known)
    assert throttle.retry_after(victim, "198.51.100.1", now) is None


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_every_address_of_an_ipv6_64_is_one_source(prefix: int, a: int, b: int) -> None:
    one = str(ipaddress.IPv6Address((prefix << 64) | a))
    two = str(ipaddress.IPv6Address((prefix << 64) | b))
    if ipaddress.IPv6Address(one).ipv4_mapped is None:
        assert source_key(one) == source_key(two)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 30.0), hosts), max_size=300), st.integers(0, 5))
def test_the_log_has_one_line_per_failure_up_to_the_burst_then_one_summary(
    failures: list[tuple[float, str]], burst: int
) -> None:
    rate = LoginLog(burst, 60.0)
    now, lines, summarised = 0.0, 0, 0
    per_interval: dict[float, int] = {}
    for gap, host in failures:
        now += gap
        summary = rate.summary(now)
        if summary is not None:
            summarised += summary.suppressed
        if rate.note(now, host, "u"):
            lines += 1
            assert rate._start is not None
            per_interval[rate._start] = per_interval.get(rate._start, 0) + 1
    final = rate.summary(now + 60.0)
    summarised += 0 if final is None else final.suppressed
    assert lines + summarised == len(failures)  # every failure told, once
    assert all(n <= burst for n in per_interval.values())
    assert rate.summary(now + 120.0) is None  # a summary is given once
