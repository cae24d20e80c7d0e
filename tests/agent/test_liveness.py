"""The core's side of a dead and a restarted broker (mdeci/agent/liveness.py), on a
fake clock with no sockets."""

from __future__ import annotations

from pathlib import Path

from mdeci.agent.events import AttachMedia, ChurnRecord, Reinvite, SipOutcome
from mdeci.agent.machine import State, Status
from mdeci.frames import List, Subs, encode
from tests.agent.test_core import BROKER_MEDIA, MEDIA, Rig, state_of, status_of


def retry_of(rig: Rig) -> float | None:
    """When the core retries, read afresh (mypy would keep an earlier narrowing)."""
    return rig.core.retry_at


def _lost(rig: Rig) -> Reinvite:
    rig.core.peer_lost(rig.now, "rudp: the broker stopped answering keepalives")
    reinvite = rig.sip(rig.commands())
    assert isinstance(reinvite, Reinvite)
    return reinvite


def test_a_silent_broker_is_logged_as_broker_lost_with_our_address(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    _lost(rig)
    assert rig.core.status is Status.DISCONNECTED
    (lost,) = [e for e in rig.events if isinstance(e, ChurnRecord) and e.event == "broker_lost"]
    assert lost.fields["addr"] == f"{MEDIA[0]}:{MEDIA[1]}"
    assert lost.fields["reason"] == "rudp: the broker stopped answering keepalives"
    # Lost again while DISCONNECTED: no second line.
    rig.core.peer_lost(rig.now, "rudp: again")
    assert rig.churn().count("broker_lost") == 1


def test_a_restarted_broker_is_probed_at_once_on_the_same_key(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    key = rig.secret
    assert key is not None
    reinvite = _lost(rig)
    # The re-INVITE goes unanswered and the core backs off.
    rig.core.sip_done(rig.now, reinvite, SipOutcome(status=None, reason="no answer"))
    assert state_of(rig.core) is State.BACKOFF and retry_of(rig) is not None
    rig.now += 0.3
    assert rig.core.broker_restarted(rig.now)
    after = rig.commands()
    assert AttachMedia(key, BROKER_MEDIA, fresh=True) in after
    (probe,) = [f for f in rig.frames(after) if isinstance(f, List)]
    assert retry_of(rig) is None  # no SIP attempt while the probe runs
    rig.core.frame_received(rig.now, encode(Subs(req=probe.req)))
    assert status_of(rig.core) is Status.CONNECTED and state_of(rig.core) is State.CONNECTED
    assert rig.churn().count("media_connected") == 2  # the first session's, and now
    assert rig.core.get_timer() is None  # nothing left to retry


def test_a_restart_is_ignored_while_connected_or_without_a_session(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert not rig.core.broker_restarted(rig.now)  # no session yet
    rig.connect()
    rig.commands()
    assert not rig.core.broker_restarted(rig.now)  # the broker we talk to answers
    assert rig.commands() == []


def test_an_unanswered_probe_of_a_restart_fails_the_attempt(tmp_path: Path) -> None:
    # A replayed datagram of an older incarnation looks like a restart: nobody answers
    # the probe, and the core goes back to its own attempts.
    rig = Rig(tmp_path)
    rig.connect()
    rig.core.peer_lost(rig.now, "rudp: gone")
    rig.commands()
    assert rig.core.broker_restarted(rig.now)
    rig.commands()
    rig.now += rig.core.response_timeout
    rig.core.handle_timer(rig.now)
    assert status_of(rig.core) is Status.DISCONNECTED
    assert "unreachable" in rig.core.counters.alerts
