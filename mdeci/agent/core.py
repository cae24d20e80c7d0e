"""The agent core: sans-IO. Frames, SIP outcomes, address changes and a clock in;
frames, SIP commands and events out.

Theory of operation
-------------------
:class:`AgentCore` owns no socket, task or clock: every input takes ``now``, a monotonic
clock that all its deadlines and delays are on (a wall-clock jump moves none); those that
meet the broker's absolute times also take ``wall``, epoch seconds (None: ``now`` is
both). The glue (:class:`mdeci.agent.aio.Agent`) feeds it and does what it asks:

- **inputs**: ``start``, ``sip_done`` (the outcome of the SIP command it asked for),
  ``media_bound`` (the RUDP socket's address), ``frames_received`` (a burst from the
  broker over RUDP), ``frame_by_sms``, ``peer_lost``, ``broker_restarted``
  (:mod:`mdeci.agent.liveness`), ``bye_received``, ``address_changed``, the applications'
  ``subscribe`` / ``unsubscribe`` / ``list`` / ``publish`` / ``stop_awaiting``,
  ``sync_outbox`` (once per loop turn after publishes), ``handle_timer`` and ``close``;
- **outputs**: ``next_command`` gives the commands of :mod:`mdeci.agent.events`
  (frames, one SIP command at a time, the RUDP socket's moves); ``get_timer`` says when
  to call ``handle_timer``; every event goes to the ``sink``. Nothing is accumulated.

The state changes only along the table of :mod:`mdeci.agent.machine`. The durable state
(gate, inbox, outbox, subscription record) is behind :mod:`mdeci.agent.files`'s
Protocols: the core reads no file and no clock. It drives :class:`~mdeci.agent.intake.Intake`
(a burst of notifications recorded with one ``fsync`` before hand-over and ack);
:class:`~mdeci.agent.requests.Requests` keeps the requests in flight and makes a publish
durable before it is sent; :class:`~mdeci.agent.subscriptions.SubsBook` keeps the
subscriptions, renews their leases and tells their ends;
:class:`~mdeci.agent.offer.SessionKeys` draws the key exchange of each offer (fail
closed: a failed agreement, or a probe that gets no authentic answer, makes the next
attempt draw new keys).

A broker store incarnation id (``a=mdeci-store`` in the SDP answer) other than our gate's
means the broker numbers from 1 again: the gate restarts, the inbox is archived, our
recorded subscriptions are sent again, and :class:`~mdeci.agent.events.StoreReplaced`
tells the applications.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from mdeci.agent.backoff import Backoff
from mdeci.agent.core_apps import ApplicationInputs
from mdeci.agent.device import DeviceSide
from mdeci.agent.errors import NotConnected, StateError
from mdeci.agent.events import (
    Address,
    Alert,
    Bye,
    ChurnRecord,
    Command,
    Invite,
    LimitNotice,
    MoveSip,
    Rebind,
    Register,
    Reinvite,
    RequestDone,
    RequestFailed,
    SendFrame,
    Sink,
    SipCommand,
    SipOutcome,
    StateChanged,
    StoreReplaced,
    hostport,
)
from mdeci.agent.files import AgentFiles, OutgoingPub
from mdeci.agent.intake import Intake
from mdeci.agent.liveness import BrokerLiveness
from mdeci.agent.machine import State, Status, Trigger, next_state
from mdeci.agent.offer import Answer, SessionKeys
from mdeci.agent.outcomes import (
    NO_AUTHENTIC_ANSWER,
    Counters,
    Failure,
    invite_failure,
    no_answer_yet,
    register_failure,
)
from mdeci.agent.requests import Pending, Requests
from mdeci.agent.subscriptions import SubsBook
from mdeci.churnlog import Event
from mdeci.config import AgentConfig
from mdeci.errors import FrameError
from mdeci.frames import (
    CalendarOk,
    Error,
    Frame,
    LimitReached,
    List,
    Notify,
    Pub,
    PubOk,
    Renew,
    Sub,
    SubInfo,
    SubOk,
    Subs,
    Unsub,
    decode,
    encode,
)
from sip.errors import SdpError

RESPONSE_TIMEOUT = 10.0  # seconds to wait for a broker's answer frame (the probe too)
PUB_OVERHEAD = 64  # a pub frame's keys, msg_id and CBOR heads, about


class AgentCore(ApplicationInputs, BrokerLiveness):
    """The agent's state machine; see the module docstring."""

    def __init__(
        self,
        config: AgentConfig,
        files: AgentFiles,
        sink: Sink,
        *,
        random_bytes: Callable[[int], bytes],
        jitter: Callable[[], float],
        response_timeout: float = RESPONSE_TIMEOUT,
        sip_addr: Address,
        media_addr: Address,
    ) -> None:
        self.config = config
        self.files = files
        self.sink = sink
        self.random_bytes = random_bytes
        self.backoff = Backoff(config.reconnect, jitter)
        self.state = State.IDLE
        self.sip_addr = sip_addr
        self.media_addr = media_addr
        self.broker_media: Address | None = None
        self.media_transport: str | None = None  # "rudp" or "quic", as the answer accepted
        self.registered = False
        self.call_id: str | None = None  # the current dialog's, None without one
        self.last_error: str | None = None
        self.counters = Counters()
        self.retry_at: float | None = None
        self._rekey = False
        self.limits: list[LimitReached] = []  # usage limits the broker told us of
        self._keys = SessionKeys.of(config, random_bytes)
        self._commands: deque[Command] = deque()
        self._sip_busy: SipCommand | None = None
        self._requests = Requests(files.outbox, self._send, sink, self._alert, response_timeout)
        self._subs = SubsBook(files.subs, self._requests, sink, self._alert)
        self._intake = Intake(files, sink, self._send, self._alert)
        self._connected = False
        self._outage_since: float | None = None
        self._move_to: str | None = None  # an address change waiting for the SIP command
        self._moving_from: Address | None = None
        self._restore_subs = False
        self._slow_at: float | None = None  # when a pending attempt counts as slow
        self._wall_offset = 0.0  # wall clock minus ``now``, as the glue last gave both
        self.device = DeviceSide(config)
        # Which interface holds an address (the glue's lookup; None: not known).
        self.interface_of: Callable[[str], str | None] = lambda host: None
        self._requests.hold = self._publish_hold

    # ------------------------------------------------------------------ observing

    @property
    def status(self) -> Status:
        return Status.CONNECTED if self._connected else Status.DISCONNECTED

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def subscriptions(self) -> tuple[SubInfo, ...]:
        return self._subs.infos()

    @property
    def subs(self) -> SubsBook:
        """The subscriptions with their leases (``states()``: live, pending and ended)."""
        return self._subs

    @property
    def response_timeout(self) -> float:
        return self._requests.response_timeout

    @property
    def store_id(self) -> str | None:
        return self.files.nseq.store_id

    def next_command(self) -> Command | None:
        return self._commands.popleft() if self._commands else None

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` must run next (None: nothing scheduled)."""
        times = (
            self._requests.deadline(),
            self._subs.deadline(connected=self._connected),
            self._intake.deadline(),
            self.retry_at,
            self._slow_at,
        )
        due = [t for t in times if t is not None]
        return min(due) if due else None

    # ------------------------------------------------------------------ helpers

    def _log(self, event: Event, **fields: Any) -> None:
        self.sink(ChurnRecord(event, fields))

    def _alert(self, kind: str, message: str) -> None:
        self.last_error = message
        self.counters.alerts[kind] = self.counters.alerts.get(kind, 0) + 1
        self.sink(Alert(kind, message))

    def _step(self, trigger: Trigger) -> None:
        """Take ``trigger``'s transition (the table in :mod:`mdeci.agent.machine`)."""
        state = next_state(self.state, trigger)
        if state is not self.state:
            self.state = state
            self.sink(StateChanged(state, self.status, trigger))

    def _sip(self, command: SipCommand, now: float | None = None) -> None:
        assert self._sip_busy is None, "one SIP command at a time"
        self._sip_busy = command
        self._commands.append(command)
        if now is not None and not self._connected:
            # SIP gives up only after 64*T1 (32 s by default): say earlier that the other
            # side does not answer (the attempt goes on).
            self._slow_at = now + self.config.reconnect.warn_after

    def _send(self, frame: Frame) -> None:
        self._commands.append(SendFrame(encode(frame)))

    def _media_connected(self, now: float) -> None:
        since, self._outage_since = self._outage_since, None
        latency = {} if since is None else {"latency_ms": round((now - since) * 1000, 3)}
        addr = hostport(self.media_addr)
        self._log(Event.MEDIA_CONNECTED, call_id=self.call_id, addr=addr, channel="ip", **latency)

    # ------------------------------------------------------------------ session

    def start(self, now: float) -> None:
        """Begin: REGISTER, then INVITE."""
        if self.state is State.IDLE:
            self._attempt(now)

    def _attempt(self, now: float) -> None:
        """One attempt to reach the broker: REGISTER if needed, else (re-)INVITE."""
        if self._sip_busy is not None or self.state in (State.CLOSING, State.CLOSED):
            return
        self.retry_at = None
        self.counters.attempts += 1
        if self._move_to is not None:
            self._begin_move(now)
        elif not self.registered:
            self._step(Trigger.REGISTER)
            self._sip(Register(self.config.registrar.expires), now)
        else:
            self._invite(now)

    def _invite(self, now: float | None = None) -> None:
        self._step(Trigger.INVITE)
        if self.call_id is not None:
            # A dialog without keys (its agreement failed) is re-keyed in place. After a
            # media failure a restarted broker may hold our old key with a new
            # RUDP incarnation we would refuse (docs/rudp.md §2 step 6); new keys give
            # both sides a fresh association.
            new_keys = self._rekey or self._keys.key is None
            self._sip(Reinvite(self._keys.offer(self.media_addr, new_keys=new_keys)), now)
        else:
            self._sip(Invite(self._keys.offer(self.media_addr, new_keys=True)), now)

    def _fail(self, now: float, kind: str, message: str) -> None:
        """An attempt failed: alert, then wait a jittered back-off before the next one."""
        self.counters.failed_attempts += 1
        self._alert(kind, message)
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self._step(Trigger.FAILED)
        self.retry_at = now + self.backoff.next_delay()

    def _failed(self, now: float, failure: Failure) -> None:
        if failure.auth:
            self.counters.auth_failures += 1
        self._fail(now, failure.kind, failure.message)

    def sip_done(
        self, now: float, command: SipCommand, outcome: SipOutcome, *, wall: float | None = None
    ) -> None:
        """The outcome of the SIP command :meth:`next_command` gave."""
        if command != self._sip_busy:
            return  # not ours (e.g. a late outcome after close)
        self._sip_busy = None
        self._slow_at = None
        if outcome.local_addr is not None:
            self.sip_addr = outcome.local_addr
        if self.state is State.CLOSING:
            self._close_step(now, command, outcome)
            return
        if isinstance(command, Register):
            self._registered(now, outcome)
        elif isinstance(command, Invite | Reinvite):
            self._answered(now, now if wall is None else wall, command, outcome)
        elif isinstance(command, MoveSip):
            self._sip_moved(now, outcome)
        if self._sip_busy is None and self._move_to is not None and self.state is not State.BACKOFF:
            self._begin_move(now)

    def _registered(self, now: float, outcome: SipOutcome) -> None:
        if not outcome.ok:
            self.registered = False
            self._failed(now, register_failure(outcome))
            return
        self.registered = True
        self._log(Event.REGISTERED, addr=hostport(self.sip_addr))
        if self._move_to is not None:
            self._begin_move(now)  # then REGISTER again there and INVITE
            return
        if outcome.contacts:
            self._alert(
                "duplicate_aor",
                f"another device is registered as {self.config.aor}: "
                + ", ".join(outcome.contacts[:3]),
            )
        self._invite(now)

    def _answered(
        self, now: float, wall: float, command: Invite | Reinvite, outcome: SipOutcome
    ) -> None:
        if not outcome.ok:
            self._lose(now, f"{type(command).__name__.upper()} failed: {outcome.status}")
            if isinstance(command, Reinvite) and outcome.status in (408, 481):
                # RFC 3261 §12.2.1.2: 481 and 408 end the dialog; start a new session.
                self.call_id = None
                if outcome.status == 481:
                    self._invite(now)
                    return
            self._failed(now, invite_failure(command, outcome))
            return
        try:
            answer = self._keys.read_answer(outcome.body)
        except SdpError as exc:
            self._fail(now, "key", f"unreadable answer from the broker: {exc}")
            return
        first = isinstance(command, Invite)
        if outcome.call_id is not None:
            self.call_id = outcome.call_id
        refused = self._keys.agree(answer, outcome.offer or self._keys.offered, outcome.body)
        if refused is not None:
            # Fail closed: no media on keys we could not agree; the next attempt
            # offers a new value.
            self._lose(now, refused)
            self._rekey = True
            self._fail(now, "key", refused)
            return
        self._rekey = False
        self._attach(answer)
        self._log(
            Event.SESSION_STARTED if first else Event.SESSION_REINVITED,
            call_id=self.call_id,
            addr=hostport(self.media_addr),
        )
        if self._check_store(now, wall, answer.store_id):
            return
        if self._connected:
            # A re-INVITE on a live session (after a move): the media path is up.
            self._media_connected(now)
            self._step(Trigger.RESUMED)
            self._tell_device(now, calendar=False)
            if self._requests.waiting:  # held for a cheaper network: maybe this one
                self._requests.flush(now)
            return
        self._step(Trigger.ANSWERED)
        self._requests.request(now, List(req=self._requests.next_req()), probe=True)

    def _attach(self, answer: Answer) -> None:
        assert self._keys.key is not None
        self.broker_media, self.media_transport = answer.media, answer.transport
        self._commands.append(answer.attach(self._keys.key))

    def _check_store(self, now: float, wall: float, store_id: str | None) -> bool:
        """Handle a new store incarnation; True when the attempt failed on the way."""
        old = self.files.nseq.store_id
        if store_id is None or store_id == old:
            return False
        # SMS, and a broker's notifications held for a cheaper network, come out of order.
        reorders = self.config.sms.enabled or bool(self.config.network.kinds)
        window = self.config.sms.window if reorders else 0
        try:
            replaced = self._intake.new_store(store_id, window, f"{old or 'unknown'}-{int(wall)}")
        except StateError as exc:
            self._fail(now, "state", str(exc))
            return True
        if replaced:
            self.counters.store_replacements += 1
            self._restore_subs = True
            self._alert(
                "store_replaced",
                f"the broker's store changed ({old or 'unknown'} -> {store_id}): delivery "
                "numbering restarted, subscriptions will be restored",
            )
            if self._connected:
                self._restore(now, wall)
        return False

    def _sip_moved(self, now: float, outcome: SipOutcome) -> None:
        prev = self._moving_from or self.sip_addr
        self._moving_from = None
        self._log(Event.IP_CHANGED, addr=hostport(self.sip_addr), prev_addr=hostport(prev))
        if not outcome.ok:
            self.registered = False
            self._lose(now, f"REGISTER after move: {outcome.status} {outcome.reason}")
            self._fail(now, "unreachable", f"REGISTER after move failed: {outcome.reason}")
            return
        if self.registered:
            self._log(Event.REGISTERED, addr=hostport(self.sip_addr))
        if self.call_id is not None and self._keys.key is not None:
            self._step(Trigger.MOVE)
            self._sip(Reinvite(self._keys.offer(self.media_addr)))
        else:
            self._attempt(now)

    def _lose(self, now: float, reason: str) -> None:
        """The media session is gone (DISCONNECTED)."""
        if not self._connected:
            return
        self._connected = False
        self.last_error = reason
        self._rekey = True
        self._outage_since = now
        self._log(Event.MEDIA_DISCONNECTED, reason=reason, channel="ip")
        self._requests.fail_all(NotConnected(reason))
        self._subs.lost()
        self.sink(StateChanged(self.state, self.status))

    def peer_lost(self, now: float, reason: str) -> None:
        """RUDP gave up on the broker (``PeerUnreachable``)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        was = self._connected
        self._lost_broker(now, reason)
        if self.state is State.PROBING:
            self._requests.fail_all(NotConnected(reason))
            self._rekey = True
            # Nothing authenticates a frame but the agreed secret: a probe that gets
            # nothing back may as well mean the exchange was altered on the path.
            self._fail(now, "unreachable", f"{NO_AUTHENTIC_ANSWER} ({reason})")
        elif was and self._sip_busy is None:
            self._attempt(now)

    def bye_received(self, now: float) -> None:
        """The broker ended our dialog."""
        if self.call_id is None or self.state in (State.CLOSING, State.CLOSED):
            return
        self._log(Event.SESSION_ENDED, call_id=self.call_id, reason="bye from broker")
        self.call_id = None
        self._lose(now, "session ended by the broker")
        if self._sip_busy is None and self.state is not State.BACKOFF:
            self._attempt(now)

    # ------------------------------------------------------------------ mobility

    def address_changed(self, now: float, host: str) -> None:
        """Our address is now ``host`` (IP monitor, or ``mdeci move``)."""
        if self.state in (State.CLOSING, State.CLOSED) or host == self.sip_addr[0]:
            return
        self._move_to = host
        if self._sip_busy is None:
            self._begin_move(now)

    def _begin_move(self, now: float) -> None:
        host, self._move_to = self._move_to, None
        assert host is not None
        self.retry_at = None
        if self._connected:
            self._outage_since = self._outage_since or now
        self._moving_from = self.sip_addr
        self._step(Trigger.MOVE)
        self._commands.append(Rebind(host))
        self._sip(MoveSip(host))

    def media_bound(self, now: float, addr: Address) -> None:
        """The RUDP socket's address (after :class:`Rebind`)."""
        self.media_addr = addr

    # ------------------------------------------------------------------ timers

    def handle_timer(self, now: float, *, wall: float | None = None) -> None:
        self._wall_offset = self._wall_offset if wall is None else wall - now
        self.sync_outbox(now)  # a held publish's timeout answers it: durable first
        self._intake.retry(now, now if wall is None else wall)
        if self._slow_at is not None and now >= self._slow_at:
            self._slow_at = None
            busy = self._sip_busy
            if busy is not None and not self._connected:
                slow = no_answer_yet(busy, self.config)
                self._alert(slow.kind, slow.message)
        for req, pending in self._requests.expired(now):
            self.counters.requests_timed_out += 1
            self._subs.failed(now, pending)
            error = NotConnected(f"no answer from the broker to {pending.frame.op}")
            self.sink(RequestFailed(req, error))
            if pending.probe:
                # Nothing authenticates a frame but the agreed secret: no answer may
                # as well mean the exchange was altered on the path.
                self._rekey = True
                self._fail(now, "unreachable", NO_AUTHENTIC_ANSWER)
        self._requests.timer(now, connected=self._connected)
        if self.retry_at is not None and now >= self.retry_at and self.state is State.BACKOFF:
            self._attempt(now)
        self._subs.timer(now, connected=self._connected)

    # ------------------------------------------------------------------ frames

    def frame_received(self, now: float, data: bytes, *, wall: float | None = None) -> None:
        """A frame from the broker over RUDP; a malformed one is dropped."""
        self.frames_received(now, (data,), wall=wall)

    def frames_received(
        self, now: float, batch: Sequence[bytes], *, wall: float | None = None
    ) -> None:
        """A burst of frames from the broker over RUDP, in order (malformed ones are
        dropped): its notifications are recorded together (module docstring)."""
        wall = now if wall is None else wall
        for data in batch:
            try:
                frame = decode(data)
            except FrameError:
                continue
            if isinstance(frame, Notify):
                self._intake.take(frame, "ip")
            else:
                # What came before it is handed over first: the events keep the order.
                self._intake.commit(now, wall)
                self._other_frame(now, wall, frame)
        self._intake.commit(now, wall)
        if self._connected:  # the broker is heard from: unanswered publishes go again
            self._requests.resend_unanswered(now)

    def _other_frame(self, now: float, wall: float, frame: Frame) -> None:
        if isinstance(frame, LimitReached):
            self.limits.append(frame)
            self.sink(LimitNotice(frame))
        elif isinstance(frame, SubOk | Subs | PubOk | Error | CalendarOk) and frame.req is not None:
            pending = self._requests.answered(frame.req)
            if pending is not None:
                self._answered_request(now, wall, frame, pending)

    def frame_by_sms(self, now: float, data: bytes, *, wall: float | None = None) -> None:
        """The SMS channel's hook: a frame from the broker's number (already acked)."""
        try:
            frame = decode(data)
        except FrameError:
            return
        nseq = frame.nseq if isinstance(frame, Notify) else None
        self._log(Event.SMS_RECEIVED, nseq=nseq, channel="sms", bytes=len(data))
        if isinstance(frame, Notify):
            self._intake.take(frame, "sms")
            self._intake.commit(now, now if wall is None else wall)

    def _answered_request(self, now: float, wall: float, frame: Frame, pending: Pending) -> None:
        sent = pending.frame
        if pending.probe:
            if isinstance(frame, Subs):
                self._listed(now, wall, frame.items)
                self._connected_now(now, wall)
            else:
                self._rekey = True
                self._fail(now, "refused", f"the broker refused our probe: {frame}")
            return
        if isinstance(sent, Pub):
            refused = isinstance(frame, Error) and (pending.awaited or frame.code < 500)
            if isinstance(frame, PubOk) or refused:
                # Accepted, refused with the application told, or never acceptable.
                self._requests.settled(sent)
            elif isinstance(frame, Error):  # told pending, refused for now: it goes again
                self._requests.resend_later(now)
        elif isinstance(sent, Sub | Renew | Unsub):
            self._subs.answered(now, wall, pending, frame)
        elif isinstance(sent, List) and isinstance(frame, Subs):
            self._listed(now, wall, frame.items)
        if pending.restore is None and pending.renew is None:
            self.sink(RequestDone(sent.req, frame))

    def _listed(self, now: float, wall: float, items: tuple[SubInfo, ...]) -> None:
        if not self._restore_subs:  # the broker's list is empty until we restored ours
            self._subs.listed(now, wall, items)

    def _connected_now(self, now: float, wall: float) -> None:
        # What went wrong before stays counted (counters.alerts) and logged; it is no
        # longer the current state.
        self.last_error = None
        self._connected = True
        self.backoff.reset()
        self._step(Trigger.PROBED)
        self._media_connected(now)
        if self._restore_subs:
            self._restore(now, wall)
        self._subs.connected(now, wall)
        self._tell_device(now)
        self._requests.flush(now)

    def _tell_device(self, now: float, *, calendar: bool = True) -> None:
        """Each session start and move: the network kind (``device``) and, with
        ``calendar``, the ``[calendar]``; before the outbox, which goes by that network."""
        host = self.media_addr[0] or self.sip_addr[0]
        self.device.locate(host, self.interface_of(host) if self.config.network.kinds else None)
        if not self.device.configured:
            return
        self._send(self.device.report())
        frame = self.device.calendar_frame(self._requests.next_req()) if calendar else None
        if frame is not None:
            self._requests.request(now, frame)

    def _publish_hold(self, pub: OutgoingPub, now: float) -> float | None:
        """Until when (``now``'s clock) ``pub`` waits for a cheaper network."""
        wall = now + self._wall_offset
        size = len(pub.payload) + len(pub.subject) + PUB_OVERHEAD
        first = pub.queued_at or wall
        found = self.device.decide_publish(
            pub.qclass, urgent=pub.urgent, size=size, first_seen=first, wall=wall
        )
        until = found.held_until if found is not None else None
        if found is not None and pub.msg_id not in self._requests.waiting:
            self._log(Event.PUBLISH_DECIDED, channel="ip", bytes=size, reason=found.describe())
        return None if until is None else now + (until - wall)

    def _restore(self, now: float, wall: float) -> None:
        """Send our recorded subscriptions again (a new broker store has none of them)."""
        self._restore_subs = False
        restored = self._subs.restore(now, wall)
        self.sink(StoreReplaced(old=None, new=self.files.nseq.store_id or "", restored=restored))

    # ------------------------------------------------------------------ shutdown

    def close(self, now: float, *, clean: bool = True) -> None:
        """Stop: with ``clean``, BYE the dialog then unREGISTER (the glue reports each)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self._requests.fail_all(NotConnected("the agent is shutting down"))
        self.retry_at = None
        self._move_to = None
        self._connected = False
        self._step(Trigger.CLOSE)
        self._sip_busy = None  # an outcome still on its way is ignored
        if clean and self.call_id is not None:
            self._sip(Bye())
        elif clean and self.registered:
            self._sip(Register(0))
        else:
            self._step(Trigger.CLOSED)

    def _close_step(self, now: float, command: SipCommand, outcome: SipOutcome) -> None:
        if isinstance(command, Bye):
            if outcome.ok:
                self._log(Event.SESSION_ENDED, call_id=self.call_id, reason="agent shutdown")
            self.call_id = None
            if self.registered:
                self._sip(Register(0))
                return
        elif isinstance(command, Register) and command.expires == 0:
            if outcome.ok:
                self._log(Event.UNREGISTERED, addr=hostport(self.sip_addr))
            self.registered = False
        self._step(Trigger.CLOSED)
