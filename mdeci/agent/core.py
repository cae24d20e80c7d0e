"""The agent core: sans-IO. Frames, SIP outcomes, address changes and a clock in;
frames, SIP commands and events out.

Theory of operation
-------------------
:class:`AgentCore` owns no socket, task or clock (``now`` is passed to every input, as
in aioquic's connection and :mod:`mdeci.broker.core`). The asyncio glue
(:class:`mdeci.agent.aio.Agent`) feeds it and carries out what it asks:

- **inputs**: :meth:`~AgentCore.start`, :meth:`~AgentCore.sip_done` (the outcome of the
  SIP command it asked for), :meth:`~AgentCore.media_bound` (the RUDP socket's address),
  :meth:`~AgentCore.frames_received` (a burst of messages from the broker over RUDP),
  :meth:`~AgentCore.frame_by_sms` (the SMS channel's hook), :meth:`~AgentCore.peer_lost`,
  :meth:`~AgentCore.bye_received`, :meth:`~AgentCore.address_changed`, the applications'
  :meth:`~AgentCore.subscribe` / :meth:`~AgentCore.unsubscribe` /
  :meth:`~AgentCore.list` / :meth:`~AgentCore.publish`, :meth:`~AgentCore.sync_outbox`
  (once per loop turn after publishes), :meth:`~AgentCore.handle_timer` and
  :meth:`~AgentCore.close`;
- **outputs**: :meth:`~AgentCore.next_command` gives :class:`SendFrame` and one SIP
  command at a time (:class:`Register`, :class:`Invite`, :class:`Reinvite`,
  :class:`Bye`, :class:`MoveSip`, and :class:`Rebind` / :class:`AttachMedia` for the
  RUDP socket); :meth:`~AgentCore.get_timer` says when to call
  :meth:`~AgentCore.handle_timer`; every event goes to the ``sink`` (churn records,
  notifications handed over, request outcomes, alerts). Nothing is accumulated.

States (``docs/agent.md`` has the diagram)::

    IDLE -start-> REGISTERING -200-> INVITING -2xx-> PROBING -subs-> CONNECTED
    any failure -> BACKOFF -timer-> REGISTERING or INVITING
    CONNECTED -peer lost / BYE-> INVITING (re-INVITE with a new key)
    CONNECTED -address change-> MOVING -rebind, REGISTER, re-INVITE-> CONNECTED
    any -close-> CLOSING -BYE, unREGISTER-> CLOSED

The exactly-once gate (:class:`~mdeci.agent.state.NseqState`), the inbox, the outbox and
the subscription record are the durable state handed in (files, no socket): a notify
the gate accepts is appended to the inbox (and a windowed gate saved) *before* ``ack``
is sent. :meth:`~AgentCore.frames_received` takes a burst (what the glue read in one
loop turn): the notifications the gate accepts in it are recorded with one append and
one ``fsync``, then handed over, then acknowledged by one cumulative ``ack``; if the
write fails, nothing of the burst is handed over or acknowledged and the gate is rolled
back, so the broker's resend is taken.
A publish is in the outbox, durably, before it is sent: :meth:`~AgentCore.publish` writes
it and holds the frame, :meth:`~AgentCore.sync_outbox` fsyncs once for all held ones and
sends them. After each connection the outbox is sent again oldest first with the same
``msg_id`` (the broker dedupes by it).

Keys (docs/security.md): each new session, and each re-INVITE after the media failed,
offers a fresh ephemeral X25519 value (``a=mdeci-kx``); the RUDP session secret is
derived from the broker's answer, our SHA-256 HA1 and both SDP bodies
(:mod:`mdeci.agent.offer`). A re-INVITE of a move offers the same value and keeps the
keys unless the answer carries a new one. A failed agreement, or a probe that gets no
authentic answer, is a ``key``/``unreachable`` alert and the next attempt draws new keys
(fail closed).

A broker store incarnation id (``a=mdeci-store`` in the SDP answer) that differs from
the one our gate belongs to means the broker numbers from 1 again: the gate restarts,
the inbox is archived, the subscriptions of our record are sent again, and a
:class:`StoreReplaced` event tells the applications.
"""

from __future__ import annotations

import base64
import contextlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from mdeci.agent.backoff import Backoff
from mdeci.agent.errors import AgentError, NotConnected, StateError
from mdeci.agent.offer import (
    Answer,
    KeyAgreementError,
    agree,
    new_key_exchange,
    read_answer,
    session_offer,
    session_psk,
)
from mdeci.agent.state import Inbox, KnownSub, NseqState, Outbox, OutgoingPub, SubsRecord
from mdeci.churnlog import Event
from mdeci.config import AgentConfig
from mdeci.errors import FrameError
from mdeci.frames import (
    Ack,
    AttrValue,
    Calendar,
    CalendarOk,
    CalendarRule,
    Error,
    Frame,
    LimitReached,
    List,
    Notify,
    Pub,
    PubOk,
    Sub,
    SubInfo,
    SubOk,
    Subs,
    Unsub,
    decode,
    encode,
)
from mdeci.sms.dedupe import NseqGate
from rudp.keys import KeyExchange
from sip.errors import SdpError

Address = tuple[str, int]
NO_AUTHENTIC_ANSWER = (
    "no authentic RUDP answer from the broker after the key agreement: the SDP key "
    "exchange was altered on the path, the password differs, or the broker's media is "
    "unreachable"
)
RESPONSE_TIMEOUT = 10.0  # seconds to wait for a broker's answer frame (the probe too)


class State(StrEnum):
    IDLE = "IDLE"
    REGISTERING = "REGISTERING"
    INVITING = "INVITING"
    PROBING = "PROBING"
    CONNECTED = "CONNECTED"
    MOVING = "MOVING"
    BACKOFF = "BACKOFF"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"


class Status(StrEnum):
    """The agent's view of its media session with the broker."""

    CONNECTED = "CONNECTED"
    DISCONNECTED = "DISCONNECTED"


# ------------------------------------------------------------------ commands out


@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send ``data`` to the broker over RUDP."""

    data: bytes


@dataclass(frozen=True, slots=True)
class AttachMedia:
    """Point the RUDP peer keyed by ``key`` at ``addr`` (a new key: a new peer)."""

    key: bytes
    addr: Address


@dataclass(frozen=True, slots=True)
class Rebind:
    """Bind the RUDP socket to ``host`` (same port if free); answer with media_bound."""

    host: str


@dataclass(frozen=True, slots=True)
class Register:
    """REGISTER at the registrar for ``expires`` seconds (0: remove our contact)."""

    expires: int


@dataclass(frozen=True, slots=True)
class Invite:
    """INVITE the broker with ``offer`` (a new dialog)."""

    offer: bytes


@dataclass(frozen=True, slots=True)
class Reinvite:
    """Re-INVITE the current dialog with ``offer``."""

    offer: bytes


@dataclass(frozen=True, slots=True)
class MoveSip:
    """Move the SIP UA to ``host`` (new sockets, REGISTER the new contact)."""

    host: str


@dataclass(frozen=True, slots=True)
class Bye:
    """End the current dialog."""


SipCommand = Register | Invite | Reinvite | MoveSip | Bye
Command = SendFrame | AttachMedia | Rebind | SipCommand


@dataclass(frozen=True, slots=True, kw_only=True)
class SipOutcome:
    """What the glue reports for a SIP command: ``status`` 2xx or the failure.

    ``status`` None: no answer at all (timeout, socket error); ``body``: the answer's SDP;
    ``call_id``: the dialog's; ``local_addr``: the UA's address after the command;
    ``contacts``: the other contacts the registrar listed for our AOR; ``offer``: our
    offer as it went on the wire when the stack rewrote it (pjsua2 adds an audio line),
    empty when it went as given (the key agreement binds the bytes sent).
    """

    status: int | None
    reason: str = ""
    body: bytes = b""
    offer: bytes = b""
    call_id: str | None = None
    local_addr: Address | None = None
    contacts: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


# ------------------------------------------------------------------ events out


@dataclass(frozen=True, slots=True)
class ChurnRecord:
    """A churn log event (docs/protocol.md §8) with its fields."""

    event: Event
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Delivered:
    """A notification handed to the applications (already durable)."""

    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RequestDone:
    """The broker answered request ``req`` (``frame``; an ``error`` frame too)."""

    req: int
    frame: Frame


@dataclass(frozen=True, slots=True)
class RequestFailed:
    """Request ``req`` will get no answer (timeout, connection lost, closed)."""

    req: int
    error: AgentError


@dataclass(frozen=True, slots=True)
class Alert:
    """A failure a user must act on (logged at once, shown by ``status``).

    ``kind``: ``auth`` (401/403), ``unreachable``, ``refused``, ``key``, ``duplicate_aor``,
    ``state``, ``store_replaced``.
    """

    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class StoreReplaced:
    """The broker's store is a new one: gate restarted, subscriptions sent again."""

    old: str | None
    new: str
    restored: int


@dataclass(frozen=True, slots=True)
class StateChanged:
    state: State
    status: Status


@dataclass(frozen=True, slots=True)
class LimitNotice:
    """The broker told us of a usage limit (``limit`` frame, issue 13); kept in
    :attr:`AgentCore.limits`."""

    frame: LimitReached


CoreEvent = (
    ChurnRecord
    | Delivered
    | RequestDone
    | RequestFailed
    | Alert
    | StoreReplaced
    | StateChanged
    | LimitNotice
)
Sink = Callable[[CoreEvent], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentFiles:
    """The durable state the core works on (files in ``state_dir``, opened by the glue)."""

    inbox: Inbox
    nseq: NseqState
    outbox: Outbox
    subs: SubsRecord


@dataclass(slots=True)
class _Pending:
    frame: Sub | Unsub | List | Pub | Calendar
    deadline: float
    probe: bool = False
    restore: KnownSub | None = None


@dataclass(slots=True)
class Counters:
    """What ``status`` shows about failures since start (never reset by a success)."""

    attempts: int = 0
    failed_attempts: int = 0
    auth_failures: int = 0
    requests_timed_out: int = 0
    store_replacements: int = 0
    alerts: dict[str, int] = field(default_factory=dict)


def hostport(addr: Address) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def notification_record(n: Notify) -> dict[str, Any]:
    """The JSON object an application receives for a notification."""
    record: dict[str, Any] = {
        "nseq": n.nseq,
        "sub_id": n.sub_id,
        "subject": n.subject,
        "msg_id": n.msg_id,
        "published_at": n.published_at,
        "attrs": dict(n.attrs),
        "payload": base64.b64encode(n.payload).decode("ascii"),
        "missed": n.missed,
    }
    with contextlib.suppress(UnicodeDecodeError):
        record["text"] = n.payload.decode("utf-8")
    return record


class AgentCore:
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
        self.response_timeout = response_timeout
        self.backoff = Backoff(config.reconnect, jitter)
        self.state = State.IDLE
        self.sip_addr = sip_addr
        self.media_addr = media_addr
        self.broker_media: Address | None = None
        self.registered = False
        self.call_id: str | None = None  # the current dialog's, None without one
        self.last_error: str | None = None
        self.counters = Counters()
        self.retry_at: float | None = None
        self._key: bytes | None = None  # the RUDP session secret (rudp.keys)
        self._kx: KeyExchange | None = None  # our exchange; its public value is offered
        self._fresh_kx = False  # the offer in flight carries a new value: the answer must too
        self._offered = b""  # the offer in flight (the key agreement binds both bodies)
        self._rekey = False
        self.limits: list[LimitReached] = []  # usage limits the broker told us of (issue 13)
        self._version = 0
        self._sess_id = str(int.from_bytes(random_bytes(4), "big"))
        self._user = config.aor.split(":", 1)[1].split("@", 1)[0]
        self._commands: deque[Command] = deque()
        self._sip_busy: SipCommand | None = None
        self._pending: dict[int, _Pending] = {}
        self._req = 0
        self._connected = False
        self._outage_since: float | None = None
        self._move_to: str | None = None  # an address change waiting for the SIP command
        self._moving_from: Address | None = None
        self._restore_subs = False
        self._slow_at: float | None = None  # when a pending attempt counts as slow
        # Notifications of the burst being read, not recorded yet (record None: a
        # duplicate), and the gate as it was before the burst.
        self._burst: list[tuple[Notify, str, dict[str, Any] | None]] = []
        self._burst_gate: NseqGate | None = None
        self._held: list[Pub] = []  # publishes written, waiting for sync_outbox

    # ------------------------------------------------------------------ observing

    @property
    def status(self) -> Status:
        return Status.CONNECTED if self._connected else Status.DISCONNECTED

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def subscriptions(self) -> tuple[SubInfo, ...]:
        return tuple(
            SubInfo(sub_id=s.sub_id, subject=s.subject, filter=s.filter, expires_at=s.expires_at)
            for s in self.files.subs.items
        )

    @property
    def store_id(self) -> str | None:
        return self.files.nseq.store_id

    def next_command(self) -> Command | None:
        return self._commands.popleft() if self._commands else None

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` must run next (None: nothing scheduled)."""
        times = [p.deadline for p in self._pending.values()]
        if self.retry_at is not None:
            times.append(self.retry_at)
        if self._slow_at is not None:
            times.append(self._slow_at)
        return min(times) if times else None

    # ------------------------------------------------------------------ helpers

    def _emit(self, event: CoreEvent) -> None:
        self.sink(event)

    def _log(self, event: Event, **fields: Any) -> None:
        self.sink(ChurnRecord(event, fields))

    def _alert(self, kind: str, message: str) -> None:
        self.last_error = message
        self.counters.alerts[kind] = self.counters.alerts.get(kind, 0) + 1
        self.sink(Alert(kind, message))

    def _set_state(self, state: State) -> None:
        if state is not self.state:
            self.state = state
            self.sink(StateChanged(state, self.status))

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

    def _next_req(self) -> int:
        self._req += 1
        return self._req

    def _offer(self, *, new_keys: bool = False) -> bytes:
        """Our next offer; ``new_keys``: with a fresh key exchange (a new session, or a
        re-key after the media failed)."""
        if new_keys or self._kx is None:
            self._kx = new_key_exchange(self.random_bytes)
            self._fresh_kx = True
        else:
            self._fresh_kx = False
        self._version += 1
        self._offered = session_offer(
            self._user,
            self._sess_id,
            self._version,
            self.media_addr,
            self._kx.public,
            self.config.msisdn,
        )
        return self._offered

    def _agree(self, answer: Answer, offer: bytes, body: bytes) -> str | None:
        """Take the keys of the broker's ``answer`` to ``offer``: None, or why it gives
        none."""
        if answer.public is None:
            if self._fresh_kx or self._key is None:
                return "the broker's answer has no a=mdeci-kx"
            return None  # a re-INVITE keeping the keys
        assert self._kx is not None
        domain = self.config.broker.aor.rsplit("@", 1)[1]
        realm = self.config.broker.realm or domain
        psk = session_psk(self._user, realm, self.config.password)
        try:
            self._key = agree(self._kx, answer.public, psk, offer, body)
        except KeyAgreementError as exc:
            return str(exc)
        return None

    def _restore_latency(self, now: float) -> dict[str, float]:
        since, self._outage_since = self._outage_since, None
        return {} if since is None else {"latency_ms": round((now - since) * 1000, 3)}

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
            self._set_state(State.REGISTERING)
            self._sip(Register(self.config.registrar.expires), now)
        else:
            self._invite(now)

    def _invite(self, now: float | None = None) -> None:
        self._set_state(State.INVITING)
        if self.call_id is not None:
            # A dialog without keys (its agreement failed) is re-keyed in place. After a
            # media failure a restarted broker may hold our old key with a new
            # RUDP incarnation we would refuse (docs/rudp.md §2 step 6); new keys give
            # both sides a fresh association.
            self._sip(Reinvite(self._offer(new_keys=self._rekey or self._key is None)), now)
        else:
            self._sip(Invite(self._offer(new_keys=True)), now)

    def _fail(self, now: float, kind: str, message: str) -> None:
        """An attempt failed: alert, then wait a jittered back-off before the next one."""
        self.counters.failed_attempts += 1
        self._alert(kind, message)
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self._set_state(State.BACKOFF)
        self.retry_at = now + self.backoff.next_delay()

    def sip_done(self, now: float, command: SipCommand, outcome: SipOutcome) -> None:
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
            self._answered(now, command, outcome)
        elif isinstance(command, MoveSip):
            self._sip_moved(now, outcome)
        if self._sip_busy is None and self._move_to is not None and self.state is not State.BACKOFF:
            self._begin_move(now)

    def _registered(self, now: float, outcome: SipOutcome) -> None:
        if not outcome.ok:
            self.registered = False
            if outcome.status in (401, 403):
                self.counters.auth_failures += 1
                self._fail(
                    now,
                    "auth",
                    f"registrar refused our credentials ({outcome.status} {outcome.reason}): "
                    "check aor and password",
                )
            elif outcome.status is None or outcome.status == 408:
                self._fail(now, "unreachable", f"registrar unreachable: {outcome.reason}")
            else:
                self._fail(now, "refused", f"REGISTER refused: {outcome.status} {outcome.reason}")
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

    def _answered(self, now: float, command: Invite | Reinvite, outcome: SipOutcome) -> None:
        if not outcome.ok:
            self._lose(now, f"{type(command).__name__.upper()} failed: {outcome.status}")
            if isinstance(command, Reinvite) and outcome.status in (408, 481):
                # RFC 3261 §12.2.1.2: 481 and 408 end the dialog; start a new session.
                self.call_id = None
                if outcome.status == 481:
                    self._invite(now)
                    return
            if outcome.status in (401, 403):
                self.counters.auth_failures += 1
                self._fail(now, "auth", f"broker refused our credentials ({outcome.status})")
            elif outcome.status is None or outcome.status == 408:
                self._fail(now, "unreachable", f"broker unreachable: {outcome.reason}")
            elif outcome.status == 488:
                self._fail(now, "key", f"broker refused our session offer: {outcome.reason}")
            else:
                self._fail(
                    now,
                    "refused",
                    f"{type(command).__name__.upper()} refused: {outcome.status} {outcome.reason}",
                )
            return
        try:
            answer = read_answer(outcome.body)
        except SdpError as exc:
            self._fail(now, "key", f"unreadable answer from the broker: {exc}")
            return
        first = isinstance(command, Invite)
        if outcome.call_id is not None:
            self.call_id = outcome.call_id
        refused = self._agree(answer, outcome.offer or self._offered, outcome.body)
        if refused is not None:
            # Fail closed: no media on keys we could not agree; the next attempt
            # offers a new value.
            self._lose(now, refused)
            self._rekey = True
            self._fail(now, "key", refused)
            return
        self._rekey = False
        self._attach(answer)
        assert self._key is not None
        self._log(
            Event.SESSION_STARTED if first else Event.SESSION_REINVITED,
            call_id=self.call_id,
            addr=hostport(self.media_addr),
        )
        if self._check_store(now, answer.store_id):
            return
        if self._connected:
            # A re-INVITE on a live session (after a move): the media path is up.
            self._log(
                Event.MEDIA_CONNECTED,
                call_id=self.call_id,
                addr=hostport(self.media_addr),
                channel="ip",
                **self._restore_latency(now),
            )
            self._set_state(State.CONNECTED)
            return
        self._set_state(State.PROBING)
        self._request(now, List(req=self._next_req()), probe=True)

    def _attach(self, answer: Answer) -> None:
        assert self._key is not None
        self.broker_media = answer.media
        self._commands.append(AttachMedia(self._key, answer.media))

    def _check_store(self, now: float, store_id: str | None) -> bool:
        """Handle a new store incarnation; True when the attempt failed on the way."""
        nseq = self.files.nseq
        if store_id is None or store_id == nseq.store_id:
            return False
        old = nseq.store_id
        if old is None and nseq.highest == 0:
            # A first session: nothing delivered yet under another store.
            try:
                nseq.restart(store_id, self.config.sms.window if self.config.sms.enabled else 0)
            except StateError as exc:
                self._fail(now, "state", str(exc))
                return True
            return False
        try:
            self.files.inbox.archive(f"{old or 'unknown'}-{int(now)}")
            nseq.restart(store_id, self.config.sms.window if self.config.sms.enabled else 0)
        except StateError as exc:
            self._fail(now, "state", str(exc))
            return True
        self.counters.store_replacements += 1
        self._restore_subs = True
        self._alert(
            "store_replaced",
            f"the broker's store changed ({old or 'unknown'} -> {store_id}): delivery "
            "numbering restarted, subscriptions will be restored",
        )
        if self._connected:
            self._restore(now)
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
        if self.call_id is not None and self._key is not None:
            self._set_state(State.MOVING)
            self._sip(Reinvite(self._offer()))
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
        self._fail_pending(NotConnected(reason))
        self.sink(StateChanged(self.state, self.status))

    def _fail_pending(self, error: AgentError) -> None:
        # A held publish is answered now ("buffered"): durable first. It stays in the
        # outbox and goes with the others after the next connection.
        held, self._held = self._held, []
        self._durable_outbox(held)
        pending, self._pending = self._pending, {}
        for req in pending:
            self.sink(RequestFailed(req, error))

    def peer_lost(self, now: float, reason: str) -> None:
        """RUDP gave up on the broker (``PeerUnreachable``)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        was = self._connected
        self._lose(now, reason)
        if self.state is State.PROBING:
            self._fail_pending(NotConnected(reason))
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
        self._set_state(State.MOVING)
        self._commands.append(Rebind(host))
        self._sip(MoveSip(host))

    def media_bound(self, now: float, addr: Address) -> None:
        """The RUDP socket's address (after :class:`Rebind`)."""
        self.media_addr = addr

    # ------------------------------------------------------------------ timers

    def handle_timer(self, now: float) -> None:
        self.sync_outbox(now)  # a held publish's timeout answers it: durable first
        if self._slow_at is not None and now >= self._slow_at:
            self._slow_at = None
            busy = self._sip_busy
            if busy is not None and not self._connected:
                where = self.config.registrar if isinstance(busy, Register) else self.config.broker
                self._alert(
                    "unreachable",
                    f"no answer to {type(busy).__name__.upper()} from {where.address} "
                    f"after {self.config.reconnect.warn_after:g} s (still trying)",
                )
        for req, pending in list(self._pending.items()):
            if pending.deadline <= now:
                del self._pending[req]
                self.counters.requests_timed_out += 1
                error = NotConnected(f"no answer from the broker to {pending.frame.op}")
                self.sink(RequestFailed(req, error))
                if pending.probe:
                    # Nothing authenticates a frame but the agreed secret: no answer may
                    # as well mean the exchange was altered on the path.
                    self._rekey = True
                    self._fail(now, "unreachable", NO_AUTHENTIC_ANSWER)
        if self.retry_at is not None and now >= self.retry_at and self.state is State.BACKOFF:
            self._attempt(now)

    # ------------------------------------------------------------------ frames

    def _request(
        self,
        now: float,
        frame: Sub | Unsub | List | Pub | Calendar,
        *,
        probe: bool = False,
        restore: KnownSub | None = None,
        hold: bool = False,
    ) -> int:
        self._pending[frame.req] = _Pending(
            frame, now + self.response_timeout, probe=probe, restore=restore
        )
        if hold:
            assert isinstance(frame, Pub)
            self._held.append(frame)  # sent by sync_outbox
        else:
            self._send(frame)
        return frame.req

    def frame_received(self, now: float, data: bytes) -> None:
        """A frame from the broker over RUDP; a malformed one is dropped."""
        self.frames_received(now, (data,))

    def frames_received(self, now: float, batch: Sequence[bytes]) -> None:
        """A burst of frames from the broker over RUDP, in order (malformed ones are
        dropped): its notifications are recorded together (module docstring)."""
        for data in batch:
            try:
                frame = decode(data)
            except FrameError:
                continue
            if isinstance(frame, Notify):
                self._take_notify(frame, "ip")
            else:
                # What came before it is handed over first: the events keep the order.
                self._commit(now)
                self._other_frame(now, frame)
        self._commit(now)

    def _other_frame(self, now: float, frame: Frame) -> None:
        if isinstance(frame, LimitReached):
            self.limits.append(frame)
            self.sink(LimitNotice(frame))
        elif isinstance(frame, SubOk | Subs | PubOk | Error | CalendarOk) and frame.req is not None:
            pending = self._pending.pop(frame.req, None)
            if pending is not None:
                self._answered_request(now, frame, pending)

    def frame_by_sms(self, now: float, data: bytes) -> None:
        """The SMS channel's hook: a frame from the broker's number (already acked)."""
        try:
            frame = decode(data)
        except FrameError:
            return
        nseq = frame.nseq if isinstance(frame, Notify) else None
        self._log(Event.SMS_RECEIVED, nseq=nseq, channel="sms", bytes=len(data))
        if isinstance(frame, Notify):
            self._take_notify(frame, "sms")
            self._commit(now)

    def _take_notify(self, n: Notify, channel: str) -> None:
        """Pass ``n`` through the gate into the burst; :meth:`_commit` records it."""
        if self._burst_gate is None:
            self._burst_gate = self.files.nseq.gate.copy()  # to roll back to
        record = notification_record(n) if self.files.nseq.gate.accept(n.nseq) else None
        self._burst.append((n, channel, record))

    def _commit(self, now: float) -> None:
        """Record the burst's new notifications (one write, one fsync), hand them over,
        then ack: nothing is acked before it is durable."""
        burst, before = self._burst, self._burst_gate
        if not burst:
            return
        self._burst, self._burst_gate = [], None
        files = self.files
        records = [record for _, _, record in burst if record is not None]
        if records:
            try:
                files.inbox.extend(records)  # the applications have them...
                if files.nseq.per_burst:
                    files.nseq.save()  # ...and a windowed gate's recent numbers too
            except StateError as exc:
                # Not durable: no ack, and the gate forgets them, so that the broker's
                # resend is taken (and not acked as a duplicate, which would lose it).
                assert before is not None
                files.nseq.gate = before
                self._alert("state", str(exc))
                return
        upto = 0
        for n, channel, record in burst:
            if record is not None:
                self.sink(Delivered(record))
                latency = max(0.0, (now - n.published_at) * 1000.0)
                self._log(Event.NOTIFY_DELIVERED, nseq=n.nseq, channel=channel, latency_ms=latency)
            if channel == "ip":
                # Up to what came by IP, not the gate's highest: the highest may have
                # come by SMS while older ones still wait for IP. The broker's ack is
                # cumulative, so one for the burst's highest covers the others.
                upto = max(upto, n.nseq)
        if upto:
            self._send(Ack(upto=upto))

    def _answered_request(self, now: float, frame: Frame, pending: _Pending) -> None:
        sent = pending.frame
        if pending.probe:
            if isinstance(frame, Subs):
                self._remember(frame.items)
                self._connected_now(now)
            else:
                self._rekey = True
                self._fail(now, "refused", f"the broker refused our probe: {frame}")
            return
        if isinstance(sent, Pub):
            if isinstance(frame, PubOk) or (isinstance(frame, Error) and frame.code < 500):
                # Accepted, or never acceptable: either way not to be sent again.
                try:
                    self.files.outbox.done(sent.msg_id)
                except StateError as exc:
                    self._alert("state", str(exc))
        elif isinstance(sent, Sub) and isinstance(frame, SubOk):
            known = KnownSub(
                sub_id=frame.sub_id,
                subject=sent.subject,
                filter=sent.filter,
                expires_at=frame.expires_at,
                qclass=sent.qclass,
            )
            old = pending.restore.sub_id if pending.restore is not None else None
            items = tuple(s for s in self.files.subs.items if s.sub_id not in (old, frame.sub_id))
            self._remember_known((*items, known))
        elif isinstance(sent, Unsub) and not isinstance(frame, Error):
            self._remember_known(tuple(s for s in self.files.subs.items if s.sub_id != sent.sub_id))
        elif isinstance(sent, List) and isinstance(frame, Subs):
            self._remember(frame.items)
        if pending.restore is None:
            self.sink(RequestDone(sent.req, frame))

    def _remember(self, items: tuple[SubInfo, ...]) -> None:
        if self._restore_subs:
            return  # the broker's list is empty until we restored ours
        # The broker's list does not carry the queue class: ours is kept per sub_id, so
        # that a restore on a new store asks for it again (issue 11).
        qclass = {s.sub_id: s.qclass for s in self.files.subs.items}
        self._remember_known(
            tuple(
                KnownSub(
                    sub_id=s.sub_id,
                    subject=s.subject,
                    filter=s.filter,
                    expires_at=s.expires_at,
                    qclass=qclass.get(s.sub_id, ""),
                )
                for s in items
            )
        )

    def _remember_known(self, items: tuple[KnownSub, ...]) -> None:
        try:
            self.files.subs.replace(items)
        except StateError as exc:
            self._alert("state", str(exc))

    def _connected_now(self, now: float) -> None:
        # What went wrong before stays counted (counters.alerts) and logged; it is no
        # longer the current state.
        self.last_error = None
        self._connected = True
        self.backoff.reset()
        self._set_state(State.CONNECTED)
        self._log(
            Event.MEDIA_CONNECTED,
            call_id=self.call_id,
            addr=hostport(self.media_addr),
            channel="ip",
            **self._restore_latency(now),
        )
        if self._restore_subs:
            self._restore(now)
        self._flush(now)

    def _restore(self, now: float) -> None:
        """Send our recorded subscriptions again (a new broker store has none of them)."""
        self._restore_subs = False
        restored = 0
        for known in self.files.subs.items:
            ttl = int(known.expires_at - now)
            if ttl <= 0:
                continue
            frame = Sub(
                req=self._next_req(),
                subject=known.subject,
                filter=known.filter,
                ttl=ttl,
                qclass=known.qclass,
            )
            self._request(now, frame, restore=known)
            restored += 1
        self._remember_known(tuple(s for s in self.files.subs.items if s.expires_at > now))
        self.sink(StoreReplaced(old=None, new=self.files.nseq.store_id or "", restored=restored))

    def _flush(self, now: float) -> None:
        """Send the buffered publishes again, oldest first, with their msg_id."""
        waiting = {p.frame.msg_id for p in self._pending.values() if isinstance(p.frame, Pub)}
        for pub in self.files.outbox.pending():
            if pub.msg_id not in waiting:
                self._send_pub(now, pub)

    def _send_pub(self, now: float, pub: OutgoingPub, *, hold: bool = False) -> int:
        frame = Pub(
            req=self._next_req(),
            msg_id=pub.msg_id,
            subject=pub.subject,
            attrs=pub.attrs,
            payload=pub.payload,
            urgent=pub.urgent,
        )
        return self._request(now, frame, hold=hold)

    # ------------------------------------------------------------------ applications

    def _need_connection(self) -> None:
        if not self._connected:
            raise NotConnected("not connected to the broker (requests are refused)")

    def subscribe(
        self,
        now: float,
        subject: str,
        filter: str = "",
        ttl: int | None = None,
        *,
        qclass: str = "",
    ) -> int:
        """Send ``sub`` (``qclass``: the queue class of its notifications, issue 13); its
        ``req``. Raises :class:`NotConnected`, :class:`FrameError`."""
        self._need_connection()
        return self._request(
            now,
            Sub(req=self._next_req(), subject=subject, filter=filter, ttl=ttl, qclass=qclass),
        )

    def send_calendar(
        self, now: float, rules: Sequence[CalendarRule], utc_offset_minutes: int = 0
    ) -> int:
        """Send this device's weekly channel calendar (issue 13); its ``req``. Raises
        :class:`NotConnected`, :class:`FrameError` (bad rules)."""
        self._need_connection()
        frame = Calendar(
            req=self._next_req(), rules=tuple(rules), utc_offset_minutes=utc_offset_minutes
        )
        return self._request(now, frame)

    def unsubscribe(self, now: float, sub_id: str) -> int:
        """Send ``unsub``; its ``req``. Raises :class:`NotConnected`, :class:`FrameError`."""
        self._need_connection()
        return self._request(now, Unsub(req=self._next_req(), sub_id=sub_id))

    def list(self, now: float) -> int:
        """Send ``list``; its ``req``. Raises :class:`NotConnected`."""
        self._need_connection()
        return self._request(now, List(req=self._next_req()))

    def publish(
        self,
        now: float,
        subject: str,
        attrs: Mapping[str, AttrValue] | None = None,
        payload: bytes = b"",
        *,
        urgent: bool = False,
    ) -> tuple[str, int | None]:
        """Buffer durably, then send if CONNECTED: ``(msg_id, req or None)``.

        Raises :class:`~mdeci.errors.FrameError` (bad subject or attributes; nothing
        stored), :class:`StateError`.
        """
        msg_id = self.random_bytes(16).hex()
        frame = Pub(
            req=0,
            msg_id=msg_id,
            subject=subject,
            attrs=dict(attrs or {}),
            payload=payload,
            urgent=urgent,
        )  # validates before anything is stored
        pub = OutgoingPub(
            msg_id=msg_id, subject=subject, attrs=frame.attrs, payload=payload, urgent=urgent
        )
        if not self._connected:
            self.files.outbox.add(pub)  # durable now: the application is answered now
            return msg_id, None
        # Written now, made durable (with the other publishes of this loop turn) by
        # sync_outbox, which sends it then: never on the wire before it is durable.
        self.files.outbox.add(pub, sync=False)
        return msg_id, self._send_pub(now, pub, hold=True)

    def sync_outbox(self, now: float) -> None:
        """The glue's durable point for publishes (once per loop turn): one fsync for the
        publishes buffered since the last one, then they are sent, in order."""
        held, self._held = self._held, []
        if not self._durable_outbox(held):
            return
        for frame in held:
            if frame.req in self._pending:  # not failed meanwhile
                self._send(frame)

    def _durable_outbox(self, held: Sequence[Pub]) -> bool:
        """fsync the outbox; if that fails the held publishes fail (the application is
        told) and are not sent again: it may publish them anew."""
        try:
            self.files.outbox.sync()
        except StateError as exc:
            self._alert("state", str(exc))
            for frame in held:
                if self._pending.pop(frame.req, None) is not None:
                    self.sink(RequestFailed(frame.req, exc))
                with contextlib.suppress(StateError):
                    self.files.outbox.done(frame.msg_id)
            return False
        return True

    # ------------------------------------------------------------------ shutdown

    def close(self, now: float, *, clean: bool = True) -> None:
        """Stop: with ``clean``, BYE the dialog then unREGISTER (the glue reports each)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self._fail_pending(NotConnected("the agent is shutting down"))
        self.retry_at = None
        self._move_to = None
        if self._connected:
            self._connected = False
        self._set_state(State.CLOSING)
        self._sip_busy = None  # an outcome still on its way is ignored
        if clean and self.call_id is not None:
            self._sip(Bye())
        elif clean and self.registered:
            self._sip(Register(0))
        else:
            self._set_state(State.CLOSED)

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
        self._set_state(State.CLOSED)
