"""The Session Manager's SMS fields (mdeci/broker/sms_sessions.py) without sockets, on a
fake clock: IP down starts a look, IP proved again stops the SMS, a new epoch makes a
running plan stale, and the fields outlive the SIP session they started in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.broker.sessions import SessionManager, SmsLook, SmsStop
from mdeci.broker.sms_sessions import (
    ArmRetry,
    CancelBuffers,
    CancelRetry,
    SmsCommand,
    StartLook,
    TellLater,
)
from tests.broker.test_sessions import ALICE, BOB, TIMEOUT, Agent, Clock


def _connected(manager: SessionManager, clock: Clock) -> Agent:
    alice = Agent(manager, clock, ALICE)
    alice.invite()
    assert manager.path_proved(ALICE, alice.epoch) == [SmsStop(ALICE)]
    return alice


def test_ip_down_starts_one_look_and_a_kick_meanwhile_one_more() -> None:
    manager, clock = SessionManager(TIMEOUT), Clock()
    alice = _connected(manager, clock)
    out = manager.media_failed(ALICE, alice.epoch, "no ACK after retries")
    assert out[-1] == SmsLook(ALICE)
    sms = manager.sms
    assert sms.kicked(ALICE, connected=False) == [StartLook(ALICE, connected=False)]
    assert sms.kicked(ALICE, connected=False) == []  # one look at a time
    assert sms.kicked(ALICE, connected=True) == []
    assert sms.look_again(ALICE) is True  # one more, as the last kick said
    assert sms.look_again(ALICE) is None
    sms.look_ended(ALICE)
    assert sms.kicked(ALICE, connected=False) == [StartLook(ALICE, connected=False)]
    assert sms.kicked(BOB, connected=False) == [StartLook(BOB, connected=False)]  # per user


def test_ip_back_stops_the_buffers_and_tells_what_waited() -> None:
    manager, clock = SessionManager(TIMEOUT), Clock()
    alice = _connected(manager, clock)
    manager.media_failed(ALICE, alice.epoch, "no ACK")
    sms = manager.sms
    sms.kicked(ALICE, connected=False)
    start = sms.look_from(ALICE, connected=False)
    assert start.after == 0 and start.flying == frozenset()
    assert sms.planned(ALICE, start.epoch, connected=False, decided=3) is False
    sms.sent(ALICE, 1, 101)
    sms.sent(ALICE, 2, 102)
    assert sms.noted(ALICE, 3) and not sms.noted(ALICE, 3)  # logged once
    assert sms.retry(ALICE, 60.0) == [ArmRetry(ALICE, 60.0)]
    assert sms.retry(ALICE, 5.0) == []  # one retry at a time
    sms.untold(ALICE, [b"limit-1"])
    sms.buffer_done(ALICE, 1)  # acknowledged by SMS
    assert sms.in_flight(ALICE) == (2,)
    assert sms.look_again(ALICE) is None
    sms.look_ended(ALICE)

    clock.advance(30.0)
    out = manager.media_heard(ALICE, alice.epoch, ("10.0.0.8", 4000))
    assert manager.is_connected(ALICE) and not [c for c in out if isinstance(c, SmsStop)]
    assert sms.in_flight(ALICE) == (2,)  # a re-INVITE or a datagram heard proves only one way
    assert manager.path_proved(ALICE, alice.epoch) == [SmsStop(ALICE)]
    assert sms.ip_back(ALICE) == [
        CancelRetry(ALICE),
        CancelBuffers(ALICE, (102,)),
        TellLater(ALICE, (b"limit-1",)),
    ]
    assert sms.in_flight(ALICE) == ()
    assert sms.noted(ALICE, 3)  # decided again from scratch
    assert sms.ip_back(ALICE) == []  # nothing left to stop


def test_a_new_epoch_makes_a_running_plan_stale() -> None:
    manager, clock = SessionManager(TIMEOUT), Clock()
    alice = _connected(manager, clock)
    sms = manager.sms
    sms.kicked(ALICE, connected=True)
    running = sms.look_from(ALICE, connected=True)
    # IP proved again while the plan was on the database thread.
    manager.media_failed(ALICE, alice.epoch, "no ACK")
    manager.media_heard(ALICE, alice.epoch, ("10.0.0.8", 4000))
    assert manager.path_proved(ALICE, alice.epoch) == [SmsStop(ALICE)]
    sms.ip_back(ALICE)
    assert sms.planned(ALICE, running.epoch, connected=True, decided=9) is True
    fresh = sms.look_from(ALICE, connected=True)
    assert fresh.after == 0  # the stale plan's decisions did not count
    assert sms.planned(ALICE, fresh.epoch, connected=True, decided=9) is False
    assert sms.look_from(ALICE, connected=True).after == 9
    assert sms.look_from(ALICE, connected=False).after == 0  # away: everything queued
    # A new calendar as well.
    running = sms.look_from(ALICE, connected=True)
    assert sms.calendar_changed(ALICE) == []
    assert sms.planned(ALICE, running.epoch, connected=True, decided=12) is True
    assert sms.look_from(ALICE, connected=True).after == 0


def test_a_retry_due_decides_again_what_was_held() -> None:
    sms = SessionManager(TIMEOUT).sms
    sms.kicked(ALICE, connected=True)
    start = sms.look_from(ALICE, connected=True)
    sms.planned(ALICE, start.epoch, connected=True, decided=4)
    assert sms.noted(ALICE, 4)
    assert sms.retry(ALICE, -1.0) == [ArmRetry(ALICE, 0.0)]  # a deadline already past
    sms.retry_due(ALICE)
    assert sms.look_from(ALICE, connected=True).after == 0 and sms.noted(ALICE, 4)
    assert sms.retry(ALICE, 1.0) == [ArmRetry(ALICE, 1.0)]
    assert sms.calendar_changed(ALICE) == [CancelRetry(ALICE)]
    assert sms.retry(ALICE, 1.0) == [ArmRetry(ALICE, 1.0)]
    sms.retry_dropped(ALICE)  # the SMS side closed
    assert sms.retry(ALICE, 1.0) == [ArmRetry(ALICE, 1.0)]


def test_the_sms_fields_outlive_the_sip_session() -> None:
    """A dialog lost while a buffer is in flight: the next session's proof stops it."""
    manager, clock = SessionManager(TIMEOUT), Clock()
    alice = _connected(manager, clock)
    assert manager.disconnect(ALICE, ended=False)[-1] == SmsLook(ALICE)
    assert manager.get(ALICE) is None
    manager.sms.sent(ALICE, 7, 70)
    alice.dialog = None
    alice.invite()  # a new dialog, a new record
    assert manager.path_proved(ALICE, alice.epoch) == [SmsStop(ALICE)]
    assert manager.sms.ip_back(ALICE) == [CancelBuffers(ALICE, (70,))]


def test_limits_are_told_once_per_period() -> None:
    sms = SessionManager(TIMEOUT).sms
    assert sms.told(ALICE, "monthly count 10", 86400.0)
    assert not sms.told(ALICE, "monthly count 10", 86400.0)
    assert sms.told(ALICE, "monthly count 10", 2 * 86400.0)  # the next period
    assert sms.told(BOB, "monthly count 10", 86400.0)


def test_rudp_samples_restart_with_a_new_association() -> None:
    sms = SessionManager(TIMEOUT).sms
    assert sms.ip_sample(ALICE, 0, 0) is None
    assert sms.ip_sample(ALICE, 100, 10) == 0.9
    assert sms.ip_sample(ALICE, 100, 10) is None  # nothing sent since
    assert sms.ip_sample(ALICE, 200, 10) == 1.0
    assert sms.ip_sample(ALICE, 10, 10) == 0.0  # fewer than before: counted from zero


_OPS = st.lists(
    st.sampled_from(["kick", "kick_up", "again", "end", "retry", "due", "back", "calendar"]),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_random_runs_keep_one_look_and_one_retry_at_a_time(ops: list[str]) -> None:
    sms = SessionManager(TIMEOUT).sms
    looking = armed = False
    for op in ops:
        out: list[SmsCommand] = []
        if op in ("kick", "kick_up"):
            out = sms.kicked(ALICE, connected=op == "kick_up")
            assert bool(out) is not looking
            looking = True
        elif (op == "again" and looking and sms.look_again(ALICE) is None) or op == "end":
            sms.look_ended(ALICE)
            looking = False
        elif op == "retry":
            out = sms.retry(ALICE, 1.0)
            assert bool(out) is not armed
            armed = True
        elif op == "due" and armed:
            sms.retry_due(ALICE)
            armed = False
        elif op in ("back", "calendar"):
            epoch = sms.look_from(ALICE, connected=True).epoch
            out = sms.ip_back(ALICE) if op == "back" else sms.calendar_changed(ALICE)
            assert (CancelRetry(ALICE) in out) is armed
            assert sms.planned(ALICE, epoch, connected=True, decided=1) is True
            armed = False
        rec = sms.get(ALICE)
        state = (False, False) if rec is None else (rec.looking, rec.retry_armed)
        assert state == (looking, armed)
