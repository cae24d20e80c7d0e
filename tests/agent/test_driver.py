"""The agent's driver (mdeci.agent.driver) without a loop: a real core on a fake clock,
its commands routed to lists, its timer recorded, moves and SIP outcomes decided."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from mdeci.agent.core import AgentCore
from mdeci.agent.driver import BYE_TIMEOUT, AgentDriver
from mdeci.agent.events import (
    AttachMedia,
    Invite,
    MoveSip,
    Rebind,
    Register,
    Reinvite,
    SipCommand,
    SipOutcome,
)
from mdeci.agent.machine import State
from mdeci.agent.reports import Reports
from mdeci.frames import List, Subs, decode, encode
from tests.agent.test_core import MEDIA, SIP, T0, Counter, Rig, config, open_files


class Driven(AgentDriver):
    """A driver whose hooks record what they are asked; the clock is ``self.now``."""

    def __init__(self, tmp_path: Path) -> None:
        self.now = T0
        self.clock = self.monotonic = lambda: self.now
        self.reports: Reports[Any, Any] = Reports("sip:alice@localhost", self._churn_failed)
        self._closed = False
        self._rebind_error = None
        self._sync_soon = False
        self.frames: list[bytes] = []
        self.attached: list[AttachMedia] = []
        self.sip: list[SipCommand | Rebind] = []
        self.armed: list[float | None] = []
        self.changes: list[bool | None] = []
        self.core = AgentCore(
            config(tmp_path), open_files(tmp_path), self._on_event, random_bytes=Counter(),
            jitter=lambda: 0.5, sip_addr=SIP, media_addr=MEDIA,
        )  # fmt: skip
        self.broker = Rig(tmp_path / "broker")  # only its SDP answers

    def _send_frame(self, data: bytes) -> None:
        self.frames.append(data)

    def _attach(self, command: AttachMedia) -> None:
        self.attached.append(command)

    def _run_sip(self, command: SipCommand | Rebind) -> None:
        self.sip.append(command)

    def _arm(self, when: float | None) -> None:
        self.armed.append(when)

    def _changed_now(self, connected: bool | None) -> None:
        self.changes.append(connected)

    def ok(self, command: SipCommand, body: bytes = b"", **fields: Any) -> None:
        self._sip_done(command, SipOutcome(status=200, body=body, call_id="call-1", **fields))

    def connect(self) -> AgentCore:
        core = self.core
        assert core is not None
        core.start(self.now)
        self._pump()
        register = self.sip.pop()
        assert isinstance(register, Register)
        self.ok(register)
        invite = self.sip.pop()
        assert isinstance(invite, Invite)
        self.ok(invite, self.broker.answer(invite.offer))
        probe = decode(self.frames[-1])
        assert isinstance(probe, List)
        self._on_burst([encode(Subs(req=probe.req, items=()))])
        return core


def connected(core: AgentCore) -> bool:
    """Read afresh (mypy would keep an earlier assert's narrowing)."""
    return core.connected


def test_commands_go_to_the_media_link_or_the_sip_worker_and_the_timer_follows(
    tmp_path: Path,
) -> None:
    driven = Driven(tmp_path)
    core = driven.connect()
    assert connected(core) and driven.changes.count(True) == 1  # the session is up, once
    assert len(driven.attached) == 1 and driven.attached[0].addr == ("127.0.0.1", 7000)
    assert driven.sip == [] and driven.armed[-1] == core.get_timer()
    assert driven._sip_timeout() is None  # a SIP command may take what SIP allows
    driven._on_bye("another call")
    assert connected(core)
    driven._on_bye("call-1")
    assert not connected(core) and driven.changes[-1] is False
    (again,) = driven.sip  # it reconnects at once
    assert isinstance(again, SipCommand)
    driven.sip.clear()
    driven._sip_done(again, SipOutcome(status=None, reason="no answer"))
    when = driven.armed[-1]  # the back-off's end is the timer the adapter sets
    assert when is not None and when > driven.now and driven.sip == []
    driven.now = when
    driven._on_timer()
    assert len(driven.sip) == 1  # tried again


def test_after_close_bursts_are_ignored_and_no_timer_is_set(tmp_path: Path) -> None:
    driven = Driven(tmp_path)
    core = driven.connect()
    core.close(driven.now, clean=True)
    driven._pump()
    assert core.state is State.CLOSING and driven._sip_timeout() == BYE_TIMEOUT
    driven._closed = True
    frames = len(driven.frames)
    driven._on_burst([b"junk"])
    driven._on_broker_restarted()
    driven._sync_outbox()
    driven._pump()
    assert len(driven.frames) == frames and driven.armed[-1] is None


def test_a_move_is_over_once_reported_and_an_unbound_address_fails_without_sip(
    tmp_path: Path,
) -> None:
    driven = Driven(tmp_path)
    core = driven.connect()
    assert driven._move(SIP[0]) is None  # already there: nothing to wait for
    before = driven._move("127.0.0.3")
    assert before is not None and driven.sip == [Rebind("127.0.0.3"), MoveSip("127.0.0.3")]
    assert not driven._moved(before)
    assert driven._sip_outcome(MoveSip("127.0.0.3")) is None  # the rebind worked: run it
    core.media_bound(driven.now, ("127.0.0.3", 4000))
    driven.sip.clear()
    driven.ok(MoveSip("127.0.0.3"), local_addr=("127.0.0.3", 5070))
    (reinvite,) = driven.sip
    assert isinstance(reinvite, Reinvite)
    driven.ok(reinvite, driven.broker.answer(reinvite.offer, new_keys=False))
    assert driven._moved(before) and core.state is State.CONNECTED
    driven._rebind_error = OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
    outcome = driven._sip_outcome(MoveSip("2001:db8::1"))
    assert outcome is not None and outcome.status is None
    assert outcome.reason == "cannot bind: [Errno 99] Cannot assign requested address"
