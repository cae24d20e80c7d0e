"""The Session Manager: the one owner of every user's session state in the broker.

Theory of operation
-------------------
Sans-IO, as ``sip/transaction.py`` and ``rudp/connection.py`` are: no socket, task,
thread, database or clock of its own. The SIP endpoint and the RUDP service hand it
events (an INVITE answered, a dialog started, refreshed or ended, media heard, media
failed for epoch N, a path proved, a timer) with the time, and carry out the commands it
returns (store the session, set its status, attach or drop the transport peer, send a
BYE, look for SMS or stop it, log); :meth:`SessionManager.next_timer` says when to call
:meth:`SessionManager.timer` next.

One :class:`UserSession` per URI holds the dialog's identity, the key exchange's public
value and the session secret, the media address and transport, the status, the epoch (a
new, larger value from one counter for every user at each new association of the
transport: a new session, a takeover by a new dialog, a re-key, a reconnection; and at
the end), the key-confirmation deadline and whether the path was proved since the last
attachment (what the SMS side waits for). Per (Call-ID, From tag) the manager also keeps
the SDP origin version of the session's answers and the answers waiting for their dialog. Per
URI, beside the sessions, it keeps the SMS fallback's fields (:attr:`SessionManager.sms`,
:mod:`mdeci.broker.sms_sessions`): :class:`SmsLook` and :class:`SmsStop` start and stop
what those fields drive.

The status follows :data:`TRANSITIONS`, a table over (status, event): ``NONE`` is "no
session" (the record is gone). docs/broker.md draws it. Every status the store holds is
written through a :class:`StoreSession` or :class:`SetStatus` command of this module,
and nothing else in the broker writes one (tests/test_layering.py).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from mdeci.broker.addresses import Address, addr_text
from mdeci.broker.sms_sessions import SmsSessions
from rudp.keys import public_tag

DialogId = tuple[str, str, str]  # (Call-ID, local tag, remote tag), as sip.dialog's
RUDP: Final = "rudp"


class Status(Enum):
    """A user's session as the broker sees it; NONE: it has none."""

    NONE = "NONE"
    CONNECTED = "CONNECTED"  # the dialog is up and the media answers: deliver over IP
    DISCONNECTED = "DISCONNECTED"  # the dialog is up, the media does not answer


class Event(Enum):
    """The kinds of event of :data:`TRANSITIONS`."""

    STARTED = "started"  # a dialog started or refreshed after an answered INVITE
    REKEYED = "rekeyed"  # a re-INVITE inside the session agreed new keys
    HEARD = "heard"  # an authentic datagram came over the current association
    FAILED = "failed"  # the transport gave up on the current association
    PROVED = "proved"  # a datagram sent over the current association was acknowledged
    ENDED = "ended"  # BYE, a kick, or no authentic datagram before the key deadline
    RESTORED = "restored"  # read back from the store at start
    LOST = "lost"  # the store says another broker holds the user now (a newer epoch)


#: (status, event) -> the status after it, for every pair that can happen; the others
#: (a refresh or a proof for a user with no session, a restore of a live one) cannot.
TRANSITIONS: Final[dict[tuple[Status, Event], Status]] = {
    (Status.NONE, Event.STARTED): Status.CONNECTED,
    (Status.NONE, Event.RESTORED): Status.CONNECTED,
    (Status.NONE, Event.HEARD): Status.NONE,
    (Status.NONE, Event.FAILED): Status.NONE,
    (Status.NONE, Event.ENDED): Status.NONE,
    (Status.NONE, Event.LOST): Status.NONE,
    (Status.CONNECTED, Event.STARTED): Status.CONNECTED,  # refresh, move or takeover
    (Status.CONNECTED, Event.REKEYED): Status.CONNECTED,
    (Status.CONNECTED, Event.HEARD): Status.CONNECTED,  # confirms the keys
    (Status.CONNECTED, Event.FAILED): Status.DISCONNECTED,
    (Status.CONNECTED, Event.PROVED): Status.CONNECTED,
    (Status.CONNECTED, Event.ENDED): Status.NONE,
    (Status.CONNECTED, Event.LOST): Status.NONE,
    (Status.DISCONNECTED, Event.STARTED): Status.CONNECTED,
    (Status.DISCONNECTED, Event.REKEYED): Status.CONNECTED,
    (Status.DISCONNECTED, Event.HEARD): Status.CONNECTED,  # it talks again: reconnect
    (Status.DISCONNECTED, Event.FAILED): Status.DISCONNECTED,
    (Status.DISCONNECTED, Event.PROVED): Status.DISCONNECTED,
    (Status.DISCONNECTED, Event.ENDED): Status.NONE,
    (Status.DISCONNECTED, Event.LOST): Status.NONE,
}


@dataclass(slots=True, eq=False)
class UserSession:
    """The one record of ``uri``'s session (the transport's peers read it)."""

    uri: str
    dialog_id: DialogId | None  # None: a session made without SIP (BrokerService.connected)
    media_addr: Address
    key: bytes = field(repr=False)  # the session secret (rudp.keys)
    # A 64-bit digest of the agent's public value the keys were agreed with (rudp.keys
    # public_tag): the value and a table keyed by it cost ~50 bytes more per session.
    kx: int | None
    started_at: float  # wall-clock seconds, as stored
    status: Status = Status.NONE
    epoch: int = 0
    transport: str = RUDP
    key_deadline: float | None = None  # when unconfirmed keys end the session
    heard: bool = False  # an authentic datagram came over the current association
    proved: bool = True  # a datagram sent since the last attachment was acknowledged
    attached_key: bytes = field(default=b"", repr=False)  # the key of the association
    # RFC 3264 §8: the o= version of the last answer in the current dialog (its sess-id
    # is the endpoint's, derived from the dialog: none kept per session).
    version: int | None = None

    @property
    def call_id(self) -> str:
        """The dialog's Call-ID ("" without one): read from ``dialog_id``, not kept twice."""
        return "" if self.dialog_id is None else self.dialog_id[0]

    @property
    def remote_tag(self) -> str:
        """The agent's tag in the dialog ("" without one)."""
        return "" if self.dialog_id is None else self.dialog_id[2]


@dataclass(frozen=True, slots=True)
class _Answer:
    """An INVITE answered 2xx, waiting for its dialog to start or refresh."""

    uri: str
    media_addr: Address
    offer: str
    key: bytes = field(repr=False)
    kx: bytes
    new_keys: bool
    msisdn: str | None
    transport: str = RUDP


# ---------------------------------------------------------------------------- events in


@dataclass(frozen=True, slots=True)
class InviteAnswered:
    """The endpoint answers ``uri``'s (re-)INVITE 2xx with these keys and SDP version;
    ``dialog_id``: the dialog a re-INVITE came in, None for a new one."""

    uri: str
    call_id: str
    from_tag: str
    dialog_id: DialogId | None
    media_addr: Address
    kx: bytes
    key: bytes = field(repr=False)
    new_keys: bool
    offer: str
    version: int  # the o= version of the answer
    msisdn: str | None = None  # the operator's record of the user's number
    transport: str = RUDP  # the data channel the answer accepted ("rudp" or "quic")


@dataclass(frozen=True, slots=True)
class DialogUp:
    """The UA reports the dialog of an answered INVITE started (or refreshed); the
    dialog's fields go to the stored row."""

    dialog_id: DialogId  # (Call-ID, local tag, remote tag)
    remote_target: str
    route_set: str
    local_seq: int
    remote_seq: int
    refreshed: bool
    wall: float  # wall-clock seconds: the stored session's times


# ---------------------------------------------------------------------------- commands out


@dataclass(frozen=True, slots=True)
class StoreSession:
    """Write ``uri``'s session row, status CONNECTED (the store's SessionRecord);
    ``refresh``: of the session this broker holds (written only while it still holds the
    user), else a new one (this broker takes the user over)."""

    uri: str
    call_id: str
    local_tag: str
    remote_tag: str
    remote_target: str
    route_set: str
    remote_sdp: str
    media_addr: str
    session_key: bytes = field(repr=False)
    msisdn: str | None
    local_cseq: int
    remote_cseq: int
    started_at: float
    updated_at: float
    refresh: bool = False
    transport: str = RUDP  # the data channel the answer accepted


@dataclass(frozen=True, slots=True)
class SetStatus:
    """Write ``uri``'s stored status (NONE: ENDED; the row stays, with its number and
    last address)."""

    uri: str
    status: Status


@dataclass(frozen=True, slots=True)
class Attach:
    """Deliver to ``session`` over the transport at ``addr`` with its key; ``moved``: the
    same association goes on at a new address (nothing is sent again). A transport
    that finds that association gone asks :meth:`SessionManager.connect` again with
    ``alive=False``."""

    session: UserSession
    addr: Address
    moved: bool


@dataclass(frozen=True, slots=True)
class Detach:
    """Stop delivering to ``uri`` (``forget``: the session is over, drop its peer)."""

    uri: str
    reason: str
    forget: bool


@dataclass(frozen=True, slots=True)
class SendBye:
    dialog_id: DialogId


@dataclass(frozen=True, slots=True)
class SmsLook:
    """Let the SMS side decide for ``uri``'s queue (its IP channel is down)."""

    uri: str


@dataclass(frozen=True, slots=True)
class SmsStop:
    """IP works both ways again for ``uri``: the SMS side stops its buffers."""

    uri: str


@dataclass(frozen=True, slots=True)
class Log:
    """A churn event, logged once the store writes before it ran."""

    event: str
    uri: str
    fields: tuple[tuple[str, str | None], ...] = ()


Command = StoreSession | SetStatus | Attach | Detach | SendBye | SmsLook | SmsStop | Log


def _in_dialog(s: UserSession, call_id: str, from_tag: str) -> bool:
    """``s``'s current dialog is the one of this Call-ID and remote (From) tag."""
    return s.dialog_id is not None and s.call_id == call_id and s.remote_tag == from_tag


# ---------------------------------------------------------------------------- the manager


class SessionManager:
    """Every user's session; see the module docstring.

    ``key_confirm_timeout``: seconds after a key agreement within which an authentic
    datagram must come, else the session ends as a key mismatch. Times given as ``now``
    are of one monotonic clock (the deadlines'); ``wall`` ones are stored.
    """

    def __init__(self, key_confirm_timeout: float = 10.0) -> None:
        self.key_confirm_timeout = key_confirm_timeout
        self._sessions: dict[str, UserSession] = {}
        self._holders: dict[int, str] = {}  # public_tag(kx) -> uri, for live sessions
        self._answers: dict[tuple[str, str], _Answer] = {}  # (Call-ID, From tag)
        self._answer_kx: dict[bytes, int] = {}  # kx of the answers waiting -> how many
        # RFC 3264 §8: the o= version of answers whose dialog is no session's current
        # one (yet), per (Call-ID, From tag); a session keeps its dialog's own.
        self._versions: dict[tuple[str, str], int] = {}
        # One counter for every user: a user's epochs grow across its sessions too, so
        # nothing of an ended session can pass for a later one's.
        self._epochs = 0
        # (key deadline, uri, id of its record): a heap, so that neither an INVITE nor a
        # timer scans every session; entries whose session moved on are skipped.
        self._deadlines: list[tuple[float, str, int]] = []
        # The SMS fallback's fields of each user: they outlive its sessions (the SMS
        # side serves users whose dialog dropped), so they are kept beside them.
        self.sms = SmsSessions()

    # ------------------------------------------------------------------ queries

    def get(self, uri: str) -> UserSession | None:
        return self._sessions.get(uri)

    def status(self, uri: str) -> Status:
        s = self._sessions.get(uri)
        return Status.NONE if s is None else s.status

    def is_connected(self, uri: str) -> bool:
        s = self._sessions.get(uri)
        return s is not None and s.status is Status.CONNECTED

    def owner(self, dialog_id: DialogId, uri: str) -> str | None:
        """``uri`` when its session is dialog ``dialog_id``, else None. ``uri``: the
        dialog's remote AOR (an agent's dialog is its own INVITE's): no table of dialogs
        per session is kept beside the UA's."""
        s = self._sessions.get(uri)
        return uri if s is not None and s.dialog_id == dialog_id else None

    def version(self, uri: str, call_id: str, from_tag: str) -> int | None:
        """The SDP version of the last answer in this dialog of ``uri``, if any."""
        s = self._sessions.get(uri)
        if s is not None and s.version is not None and _in_dialog(s, call_id, from_tag):
            return s.version
        return self._versions.get((call_id, from_tag))

    def keeps_keys(self, uri: str, dialog_id: DialogId | None, kx: bytes) -> bool:
        """A re-INVITE of ``uri``'s session offering the value its keys came from."""
        s = self._sessions.get(uri)
        if s is None or dialog_id is None or s.dialog_id != dialog_id:
            return False
        return s.kx == public_tag(kx)

    def kx_holder(self, kx: bytes) -> str | None:
        """The user whose live or answered session was agreed with ``kx``, if any."""
        holder = self._holders.get(public_tag(kx))
        if holder is not None or kx not in self._answer_kx:
            return holder
        return next(a.uri for a in self._answers.values() if a.kx == kx)

    def __len__(self) -> int:
        return len(self._sessions)

    def uris(self) -> list[str]:
        return list(self._sessions)

    def next_timer(self) -> float | None:
        """When :meth:`timer` has something to do next, if ever."""
        heap = self._deadlines
        while heap and not self._due(heap[0]):
            heapq.heappop(heap)  # a deadline its session no longer has
        return heap[0][0] if heap else None

    def _due(self, entry: tuple[float, str, int]) -> bool:
        s = self._sessions.get(entry[1])
        return s is not None and s.key_deadline == entry[0] and id(s) == entry[2]

    # ------------------------------------------------------------------ SIP events

    def answered(self, ev: InviteAnswered) -> list[Command]:
        """``ev`` was answered 2xx; its dialog's event completes it (:meth:`dialog_up`).

        A re-key inside the session switches the transport now: the agent sends under
        the new keys as soon as it has the answer, which may come before the UA reports
        the refresh (it waits for the ACK)."""
        key = (ev.call_id, ev.from_tag)
        s = self._sessions.get(ev.uri)
        if s is not None and _in_dialog(s, ev.call_id, ev.from_tag):
            s.version = ev.version
        else:
            self._versions[key] = ev.version
        self._drop_answer(key)
        self._answers[key] = _Answer(
            ev.uri, ev.media_addr, ev.offer, ev.key, ev.kx, ev.new_keys, ev.msisdn, ev.transport
        )
        self._answer_kx[ev.kx] = self._answer_kx.get(ev.kx, 0) + 1
        if not ev.new_keys or s is None or s.dialog_id != ev.dialog_id:
            return []
        self._set_kx(s, ev.kx)
        return self._connect(
            s, ev.media_addr, ev.key, Event.REKEYED, alive=True, transport=ev.transport
        )

    def dialog_up(self, ev: DialogUp, now: float) -> list[Command]:
        """The dialog of an answered INVITE started (or was refreshed): the session is
        stored, then delivered to."""
        call_id, local_tag, remote_tag = ev.dialog_id
        answer = self._drop_answer((call_id, remote_tag))
        if answer is None:
            return []  # not an agent's session
        uri, addr = answer.uri, answer.media_addr
        s = self._sessions.get(uri)
        same = s is not None and s.dialog_id == ev.dialog_id
        if ev.refreshed and not same:
            # The refresh of a dialog a newer INVITE already replaced (its ACK came late):
            # applying it would put the user back on that dialog's keys.
            return []
        out: list[Command] = []
        prev_addr = None if s is None else addr_text(s.media_addr)
        if s is None:
            s = self._new(uri, ev.dialog_id, addr, answer.key, ev.wall)
        elif not same:
            # A new dialog of the same user (e.g. a restarted agent) replaces the old one.
            if s.dialog_id is not None:
                out.append(SendBye(s.dialog_id))
            s.dialog_id, s.started_at, s.key_deadline, s.version = ev.dialog_id, ev.wall, None, None
        if (version := self._versions.pop((call_id, remote_tag), None)) is not None:
            s.version = version  # the session's dialog now: it keeps its own
        self._set_kx(s, answer.kx)
        out.append(
            StoreSession(
                uri=uri,
                call_id=call_id,
                local_tag=local_tag,
                remote_tag=remote_tag,
                remote_target=ev.remote_target,
                route_set=ev.route_set,
                remote_sdp=answer.offer,
                media_addr=addr_text(addr),
                session_key=answer.key,
                msisdn=answer.msisdn,
                local_cseq=ev.local_seq,
                remote_cseq=ev.remote_seq,
                started_at=s.started_at,
                updated_at=ev.wall,
                refresh=same,
                transport=answer.transport,
            )
        )
        name = "session_reinvited" if ev.refreshed else "session_started"
        fields = (("call_id", call_id), ("addr", addr_text(addr)), ("prev_addr", prev_addr))
        out.append(Log(name, uri, fields))
        # The row just written says CONNECTED: no status write of its own.
        out += self._connect(
            s, addr, answer.key, Event.STARTED, alive=True, write=False, transport=answer.transport
        )
        if answer.new_keys and s.key_deadline is None and not s.heard:
            # A pending check keeps its deadline: re-keying again and again (as an agent
            # whose keys never work does) must not postpone the verdict forever.
            s.key_deadline = now + self.key_confirm_timeout
            heapq.heappush(self._deadlines, (s.key_deadline, uri, id(s)))
        return out

    def dialog_ended(self, dialog_id: DialogId, uri: str, reason: str) -> list[Command]:
        """BYE (or the UA's end of the dialog) for ``dialog_id``, whose remote AOR is
        ``uri`` (see :meth:`owner`)."""
        if self.owner(dialog_id, uri) is None:
            return []  # a dialog that was already replaced, or never a session
        return self._end(self._sessions[uri], reason, bye=False)

    def kick(self, uri: str) -> list[Command]:
        """End ``uri``'s session now (the operator's kick): BYE and ENDED."""
        s = self._sessions.get(uri)
        if s is None or s.dialog_id is None:
            return []
        return self._end(s, "kicked", bye=True)

    def drain(self) -> list[Command]:
        """End every session now (``mdeci admin drain``): BYE and ENDED, reason
        ``drained``; each agent INVITEs again and reaches another broker."""
        out: list[Command] = []
        for s in list(self._sessions.values()):
            out += self._end(s, "drained", bye=True)
        return out

    def restored(
        self,
        uri: str,
        dialog_id: DialogId,
        media_addr: Address,
        key: bytes,
        kx: bytes | None,
        started_at: float,
        transport: str = RUDP,
    ) -> list[Command]:
        """``uri``'s session stored CONNECTED on ``transport``, read back at start.

        A QUIC session ends with a BYE: its connection's state died with the process, and
        only the agent (the QUIC client) can open another, which it would do only at
        QUIC's idle timeout; the BYE makes it INVITE again at once. Its queue stays."""
        if uri in self._sessions:
            return []  # a live session is newer than any row
        if transport != RUDP:
            reason = "broker restarted: the QUIC connection is gone"
            fields = (
                ("call_id", dialog_id[0]),
                ("addr", addr_text(media_addr)),
                ("reason", reason),
            )
            return [
                SetStatus(uri, Status.NONE),
                Log("session_ended", uri, fields),
                SendBye(dialog_id),
            ]
        s = self._new(uri, dialog_id, media_addr, key, started_at)
        self._set_kx(s, kx)
        s.status = Status.NONE
        # The row is stored CONNECTED already (that is why it is read back): a status
        # write per session would cost a restart one commit each.
        return self._connect(s, media_addr, key, Event.RESTORED, alive=False, write=False)

    def lost(self, uri: str, owner: str, epoch: int) -> list[Command]:
        """The store refused a write or read for ``uri``: broker ``owner`` holds the user
        at ``epoch`` now (its agent went there). Drop the session without a word to the
        agent or the store, both of which belong to the new holder now."""
        s = self._sessions.get(uri)
        if s is None:
            return []
        s.status = TRANSITIONS[(s.status, Event.LOST)]
        self._forget(s)
        reason = f"lost to {owner or 'no broker'} at epoch {epoch}"
        fields = (("call_id", s.call_id), ("addr", addr_text(s.media_addr)), ("reason", reason))
        return [Detach(uri, reason, forget=True), Log("session_ended", uri, fields)]

    def unrestorable(self, uri: str) -> list[Command]:
        """``uri``'s stored session cannot be read back: it is DISCONNECTED."""
        if uri in self._sessions:
            return []
        return [SetStatus(uri, Status.DISCONNECTED)]

    # ------------------------------------------------------------------ transport events

    def connect(self, uri: str, addr: Address, key: bytes, *, alive: bool) -> list[Command]:
        """``uri``'s (re-)INVITE completed with this media address and key, without a
        dialog of ours (a session made by hand: tests, tools). The same key on a live
        association while CONNECTED is a move."""
        s = self._sessions.get(uri)
        if s is None:
            s = self._new(uri, None, addr, key, 0.0)
            s.status = Status.NONE
        return self._connect(s, addr, key, Event.STARTED, alive=alive)

    def disconnect(self, uri: str, *, ended: bool) -> list[Command]:
        """``uri``'s session is gone without a dialog event (``ended``: as by BYE)."""
        s = self._sessions.get(uri)
        if s is not None:
            s.status = TRANSITIONS[(s.status, Event.ENDED)]
            self._forget(s)
        if ended:
            return [
                SetStatus(uri, Status.NONE),
                Detach(uri, "session ended", forget=True),
            ]
        return [SetStatus(uri, Status.DISCONNECTED), Detach(uri, "sip", forget=True), SmsLook(uri)]

    def media_heard(self, uri: str, epoch: int, addr: Address) -> list[Command]:
        """An authentic datagram came from ``uri``'s association of ``epoch`` (from
        ``addr``): the keys are confirmed; a DISCONNECTED user is connected again, as a
        re-INVITE with the same key would connect it."""
        s = self._sessions.get(uri)
        if s is None or s.epoch != epoch:
            return []
        s.heard = True
        if s.status is Status.CONNECTED:
            return []
        return self._connect(s, addr, s.key, Event.HEARD, alive=False)

    def media_failed(self, uri: str, epoch: int, reason: str) -> list[Command]:
        """The transport gave up on ``uri``'s association of ``epoch``."""
        s = self._sessions.get(uri)
        if s is None or s.epoch != epoch or s.status is not Status.CONNECTED:
            return []  # a send of an earlier connection: its failure says nothing now
        s.status = TRANSITIONS[(s.status, Event.FAILED)]
        return [
            SetStatus(uri, Status.DISCONNECTED),
            Detach(uri, f"{s.transport}: {reason}", forget=False),
            SmsLook(uri),
        ]

    def path_proved(self, uri: str, epoch: int) -> list[Command]:
        """A datagram sent over ``uri``'s association of ``epoch`` was acknowledged: IP
        works both ways (a completed re-INVITE proves only SIP)."""
        s = self._sessions.get(uri)
        if s is None or s.epoch != epoch or s.proved:
            return []
        s.status = TRANSITIONS.get((s.status, Event.PROVED), s.status)
        s.proved = True
        return [SmsStop(uri)]

    def timer(self, now: float) -> list[Command]:
        """End every session whose keys were not confirmed by their deadline: no
        authentic datagram since the key agreement means the two ends derived different
        secrets (an SDP rewritten on the path, or another password)."""
        out: list[Command] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if not self._due(entry):
                continue
            s = self._sessions[entry[1]]
            s.key_deadline = None
            if not s.heard:
                out += self._end(s, "key mismatch", bye=True)
        return out

    # ------------------------------------------------------------------ internals

    def _new(
        self, uri: str, dialog_id: DialogId | None, addr: Address, key: bytes, started: float
    ) -> UserSession:
        s = UserSession(uri, dialog_id, addr, key, None, started)
        self._sessions[uri] = s
        return s

    def _connect(
        self,
        s: UserSession,
        addr: Address,
        key: bytes,
        event: Event,
        *,
        alive: bool,
        write: bool = True,
        transport: str | None = None,
    ) -> list[Command]:
        """``transport``: the data channel an answer accepted (None: the session's stays);
        another one than the session's is a new association, as a new key is."""
        before = s.status
        s.status = TRANSITIONS[(before, event)]
        s.media_addr = addr
        switched = transport is not None and transport != s.transport
        if transport is not None:
            s.transport = transport
        if before is Status.CONNECTED and key == s.attached_key and alive and not switched:
            # The same association, delivering: only the path changed.
            return [Attach(s, addr, moved=True)]
        s.key = key
        if key != s.attached_key or switched:
            s.heard = False  # a new association: nothing heard over it yet
            s.attached_key = key
        s.epoch = self._next_epoch()
        s.proved = False  # the SMS side hears of it at the first acknowledged send
        out: list[Command] = [Attach(s, addr, moved=False)]
        if write:
            out.append(SetStatus(s.uri, Status.CONNECTED))
        return out

    def _end(self, s: UserSession, reason: str, *, bye: bool) -> list[Command]:
        s.status = TRANSITIONS[(s.status, Event.ENDED)]
        self._forget(s)
        out: list[Command] = [
            SetStatus(s.uri, Status.NONE),
            Detach(s.uri, "session ended", forget=True),
            Log(
                "session_ended",
                s.uri,
                (("call_id", s.call_id), ("addr", addr_text(s.media_addr)), ("reason", reason)),
            ),
        ]
        if bye and s.dialog_id is not None:
            out.append(SendBye(s.dialog_id))
        return out

    def _forget(self, s: UserSession) -> None:
        del self._sessions[s.uri]
        self._versions.pop((s.call_id, s.remote_tag), None)
        self._set_kx(s, None)
        s.epoch = self._next_epoch()  # whatever still completes belongs to no connection

    def _next_epoch(self) -> int:
        self._epochs += 1
        return self._epochs

    def _set_kx(self, s: UserSession, kx: bytes | None) -> None:
        if s.kx is not None and self._holders.get(s.kx) == s.uri:
            del self._holders[s.kx]
        s.kx = None if kx is None else public_tag(kx)
        if s.kx is not None:
            self._holders[s.kx] = s.uri

    def _drop_answer(self, key: tuple[str, str]) -> _Answer | None:
        answer = self._answers.pop(key, None)
        if answer is not None:
            left = self._answer_kx[answer.kx] - 1
            if left:
                self._answer_kx[answer.kx] = left
            else:
                del self._answer_kx[answer.kx]
        return answer


__all__ = [
    "TRANSITIONS",
    "Attach",
    "Command",
    "Detach",
    "DialogUp",
    "Event",
    "InviteAnswered",
    "Log",
    "SendBye",
    "SessionManager",
    "SetStatus",
    "SmsLook",
    "SmsStop",
    "Status",
    "StoreSession",
    "UserSession",
    "addr_text",
]
