"""MigrationWatch on a fake clock: a PING per quiet interval, within the window, until
the server has sent what only a validated path allows."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quicdata.migration import AMPLIFICATION, MigrationWatch


def test_pings_on_silence_until_the_window_ends() -> None:
    watch = MigrationWatch(interval=0.1, window=0.35)
    watch.start(10.0)
    watch.sent(40)  # the PING from the new address
    assert watch.due == 10.1
    assert not watch.fire(10.05)
    assert watch.fire(10.1) and watch.due == 10.2
    watch.heard(50, 10.15)  # the server answers: quiet again from then
    assert not watch.fire(10.2)
    assert watch.fire(10.26)
    assert watch.due == 10.35  # the window's end
    assert not watch.fire(10.35) and not watch.active and watch.due is None


def _due(watch: MigrationWatch) -> float | None:
    return watch.due  # read afresh (a plain attribute read would stay narrowed)


def test_stops_once_the_server_sent_more_than_an_unvalidated_path_allows() -> None:
    watch = MigrationWatch(interval=0.1, window=5.0)
    watch.start(0.0)
    watch.sent(40)
    watch.heard(AMPLIFICATION * 40, 0.01)  # as much as the limit: still watching
    assert _due(watch) == 0.11
    watch.heard(1, 0.02)
    assert _due(watch) is None and not watch.fire(1.0)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0.0, 0.3), st.integers(0, 2000), st.integers(0, 1500)), max_size=60
    ),
    interval=st.floats(0.01, 0.5),
    window=st.floats(0.1, 3.0),
)
def test_never_pings_faster_than_the_interval_nor_after_the_window(
    steps: list[tuple[float, int, int]], interval: float, window: float
) -> None:
    watch = MigrationWatch(interval, window)
    now = 100.0
    watch.start(now)
    last_ping = last_heard = now
    sent = received = 0
    for dt, heard, out in steps:
        now += dt
        if watch.fire(now):
            assert now < 100.0 + window
            assert now - max(last_ping, last_heard) >= interval - 1e-9
            assert received <= AMPLIFICATION * sent
            last_ping = now
        if out:
            watch.sent(out)
            sent += out
        if heard:
            watch.heard(heard, now)
            received += heard
            last_heard = now
