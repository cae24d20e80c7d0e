"""The agent's inputs to its core and the core's commands out, without a loop (sans-IO).

:class:`AgentDriver` is the part of :class:`~mdeci.agent.aio.Agent` that decides: which
input reaches the core and when (not after close, a BYE only for our call), what each
command becomes (a frame to the media link, a peer to attach, work for the SIP worker),
when the core's timer is due, what a SIP command's outcome is when it cannot run, how
long a SIP command may take, and when a move is over. The clocks are the ones injected
into the agent; the hooks at the end are the adapter's (``mdeci.agent.aio``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mdeci.agent.core import AgentCore
from mdeci.agent.events import (
    AttachMedia,
    CoreEvent,
    MoveSip,
    Rebind,
    SendFrame,
    SipCommand,
    SipOutcome,
)
from mdeci.agent.machine import State
from mdeci.agent.reports import Reports
from mdeci.churnlog import Event

BYE_TIMEOUT = 3.0  # seconds for BYE and unREGISTER on shutdown


class AgentDriver:
    """The deciding half of the agent (module docstring); the adapter owns the fields."""

    clock: Callable[[], float]
    monotonic: Callable[[], float]
    core: AgentCore | None
    reports: Reports[Any, Any]
    _closed: bool
    _rebind_error: OSError | None  # why the last Rebind failed, None when it worked
    _sync_soon: bool

    # ------------------------------------------------------------------ inputs

    def _on_timer(self) -> None:
        assert self.core is not None
        self.core.handle_timer(self.monotonic(), wall=self.clock())
        self._pump()

    def _on_peer_lost(self, reason: str) -> None:
        if self.core is not None:
            self.core.peer_lost(self.monotonic(), reason)
            self._pump()

    def _on_broker_restarted(self) -> None:
        if self.core is not None and not self._closed:
            self.core.broker_restarted(self.monotonic())
            self._pump()

    def _on_burst(self, burst: list[bytes]) -> None:
        if self.core is not None and not self._closed:
            self.core.frames_received(self.monotonic(), burst, wall=self.clock())
            self._pump()

    def _sync_outbox(self) -> None:
        """The outbox's durable point for this loop turn."""
        self._sync_soon = False
        if self.core is not None and not self._closed:
            self.core.sync_outbox(self.monotonic())
            self._pump()

    def _on_sms_frame(self, data: bytes) -> None:
        # The SMS channel's hook into the core (agent/sms.py).
        if self.core is not None:
            self.core.frame_by_sms(self.monotonic(), data, wall=self.clock())
            self._pump()

    def _on_bye(self, call_id: str) -> None:
        core = self.core
        if core is not None and core.call_id == call_id:
            core.bye_received(self.monotonic())
            self._pump()

    def _sip_done(self, command: SipCommand, outcome: SipOutcome) -> None:
        assert self.core is not None
        self.core.sip_done(self.monotonic(), command, outcome, wall=self.clock())
        self._pump()

    def _on_event(self, event: CoreEvent) -> None:
        self._changed_now(self.reports.handle(event))

    def _churn_failed(self, message: str) -> None:
        if self.core is not None:
            self.core.last_error = message

    # ------------------------------------------------------------------ decisions

    def _pump(self) -> None:
        """Carry out the core's commands, then set its timer."""
        core = self.core
        assert core is not None
        while (command := core.next_command()) is not None:
            if isinstance(command, SendFrame):
                self._send_frame(command.data)  # in order: RUDP keeps it
            elif isinstance(command, AttachMedia):
                self._attach(command)
            else:
                self._run_sip(command)
        self._arm(None if self._closed else core.get_timer())

    def _sip_outcome(self, command: SipCommand) -> SipOutcome | None:
        """The outcome of ``command`` when it cannot run: a move's REGISTER after the
        media socket could not be bound to the new address. None: run it."""
        if isinstance(command, MoveSip) and self._rebind_error is not None:
            return SipOutcome(status=None, reason=f"cannot bind: {self._rebind_error}")
        return None

    def _sip_timeout(self) -> float | None:
        """How long a SIP command may take: BYE and unREGISTER on shutdown are bounded."""
        assert self.core is not None
        return BYE_TIMEOUT if self.core.state is State.CLOSING else None

    def _move(self, host: str) -> int | None:
        """Tell the core our address is ``host``; the ``ip_changed`` count to wait past
        (:meth:`_moved`), or None when nothing is to wait for (there already)."""
        core = self.core
        assert core is not None
        before = self.reports.counts[str(Event.IP_CHANGED)]
        core.address_changed(self.monotonic(), host)
        self._pump()
        if core.sip_addr[0] == host and core.state is not State.MOVING:
            return None
        return before

    def _moved(self, before: int) -> bool:
        """Whether the move :meth:`_move` started is over (done, or failed)."""
        assert self.core is not None
        return self.reports.counts[str(Event.IP_CHANGED)] > before and (
            self.core.state is not State.MOVING
        )

    # ------------------------------------------------------------------ the adapter's hooks

    def _send_frame(self, data: bytes) -> None:
        """Send a frame to the broker over the media link."""
        raise NotImplementedError

    def _attach(self, command: AttachMedia) -> None:
        """Attach the media link to the broker's RUDP peer."""
        raise NotImplementedError

    def _run_sip(self, command: SipCommand | Rebind) -> None:
        """Queue ``command`` for the SIP worker (one at a time, in order)."""
        raise NotImplementedError

    def _arm(self, when: float | None) -> None:
        """Call :meth:`_on_timer` at ``when`` (monotonic), instead of any time set before."""
        raise NotImplementedError

    def _changed_now(self, connected: bool | None) -> None:
        """Something happened; ``connected``: the session's new state, if it changed."""
        raise NotImplementedError
