"""Which waiters an acknowledgement or a failure completes (sans-IO, handles are strings)."""

from __future__ import annotations

from rudp.waiters import Waiters


def test_a_message_waiter_completes_once_the_acks_reach_it() -> None:
    waiters: Waiters[str] = Waiters()
    waiters.add(0, "m0")
    waiters.add(1, "m1")
    waiters.add(3, "m3")
    assert list(waiters.acked(0)) == ["m0"]
    assert list(waiters.acked(0)) == []
    assert list(waiters.acked(2)) == ["m1"]  # one run of acks completes what it passes
    assert len(waiters) == 1
    assert list(waiters.acked(3)) == ["m3"]
    assert len(waiters) == 0


def test_a_batch_completes_once_on_its_last_ack() -> None:
    waiters: Waiters[str] = Waiters()
    waiters.add_batch([3, 4, 5], "batch")
    assert [list(waiters.acked(i)) for i in (3, 4, 5)] == [[], [], ["batch"]]
    assert len(waiters) == 0


def test_one_run_of_acks_completes_sends_then_drains_in_order() -> None:
    waiters: Waiters[str] = Waiters()
    waiters.add(0, "single")
    waiters.add_batch([1, 2], "batch")
    waiters.add_drain(2, "drain")
    waiters.add(3, "later")
    assert list(waiters.acked(2)) == ["single", "batch", "drain"]
    assert len(waiters) == 1


def test_drains_complete_oldest_first_once_their_last_id_is_acked() -> None:
    waiters: Waiters[str] = Waiters()
    waiters.add_drain(2, "first")
    waiters.add_drain(5, "second")
    assert list(waiters.acked(1)) == []
    assert list(waiters.acked(2)) == ["first"]
    assert list(waiters.acked(5)) == ["second"]


def test_a_failure_fails_its_batch_once_and_every_drain() -> None:
    waiters: Waiters[str] = Waiters()
    waiters.add_batch([0, 1], "batch")
    waiters.add(2, "single")
    waiters.add_drain(2, "drain")
    assert list(waiters.failed(0)) == ["batch", "drain"]
    assert list(waiters.failed(1)) == []  # the rest of the batch waits on nothing
    assert list(waiters.failed(2)) == ["single"]
    assert len(waiters) == 0


def test_close_returns_every_waiter_once() -> None:
    waiters: Waiters[str] = Waiters()
    waiters.add_batch([0, 1], "batch")
    waiters.add(2, "single")
    waiters.add_drain(2, "drain")
    assert sorted(waiters.close()) == ["batch", "drain", "single"]
    assert len(waiters) == 0 and list(waiters.acked(0)) == []
