"""The replay window against its definition, for any order of packet numbers; and what it
costs an idle connection."""

from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from rudp import RudpConfig
from rudp.connection import RudpConnection

WINDOW = 64  # small, so that sequences cross and jump past it


class Reference:
    """The window by definition: every number seen, and the newest; a number is a replay
    when seen already or older than the window below the newest."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.seen: set[int] = set()

    def check(self, pn: int) -> bool | None:
        newest = max(self.seen, default=-1)
        if pn > newest:
            return True
        if newest - pn >= self.window or pn in self.seen:
            return None
        return False

    def commit(self, pn: int) -> None:
        self.seen.add(pn)


def connection(window: int = WINDOW) -> RudpConnection:
    return RudpConnection(b"k" * 32, RudpConfig(replay_window=window), sender_id=1)


# Mostly near the newest (reordering, duplicates), sometimes far ahead (a loss burst
# past the window) or far behind.
steps = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=-2 * WINDOW, max_value=2 * WINDOW),
)


@settings(max_examples=400, deadline=None)
@given(st.integers(min_value=0, max_value=3 * WINDOW), st.lists(steps, max_size=200))
def test_the_window_follows_its_definition(first: int, moves: list[int]) -> None:
    conn, ref = connection(), Reference(WINDOW)
    pn = first
    for move in [0, *moves]:
        pn = max(0, pn + move)
        got = conn._check_replay(pn)
        assert got == ref.check(pn), pn
        if got is not None:
            conn._commit_replay(pn)
            ref.commit(pn)


def test_an_in_order_stream_leaves_nothing_to_remember() -> None:
    """Every number arrived: the window holds no bit (a small int, shared), however many
    packets passed; a bitmap of the numbers seen would hold ``replay_window`` bits."""
    conn = connection(window=1024)
    for pn in range(5000):
        assert conn._check_replay(pn) is True
        conn._commit_replay(pn)
    assert conn._pn_missing == 0 and sys.getsizeof(conn._pn_missing) <= 28
    # One lost number is remembered until it arrives, then forgotten.
    conn._commit_replay(5001)
    assert conn._check_replay(5000) is False and conn._check_replay(5001) is None
    conn._commit_replay(5000)
    assert conn._pn_missing == 0
