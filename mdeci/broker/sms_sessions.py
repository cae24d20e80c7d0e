"""The Session Manager's SMS part: each user's SMS fallback fields, sans-IO.

Theory of operation
-------------------
:class:`SmsSessions` (``SessionManager.sms``) keeps one :class:`SmsSession` per URI:
what the SMS fallback (:mod:`mdeci.broker.sms`) knows of a user between its looks at
the user's queue. The SMS side reports what happened (a kick, a plan back, a buffer
sent or done, a retry due, IP proved, a new calendar) and carries out the commands it
gets back (:class:`StartLook`, :class:`ArmRetry`, :class:`CancelRetry`,
:class:`CancelBuffers`, :class:`TellLater`); it keeps no per-user state of its own, only
the I/O handles those commands drive (the look's task, the retry's timer handle, the
link's buffers).

A record outlives the user's SIP session: a user whose dialog dropped is exactly the
one the SMS side serves, and its buffers in flight must still be stopped when IP comes
back under a new dialog. So the records are keyed by URI beside the sessions', not
inside a :class:`~mdeci.broker.sessions.UserSession` (which ends with its dialog).

The SMS epoch grows whenever a plan computed before may no longer be carried out: IP
proved again (its buffers are cancelled, IP delivers) or a new calendar (its holds
are decided again). A plan is stamped with the epoch when its look starts; one that
comes back under another epoch is stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class SmsSession:
    """The SMS fallback's fields of ``uri``."""

    uri: str
    flying: dict[int, int] = field(default_factory=dict)  # nseq -> SMS buffer id
    noted: set[int] = field(default_factory=set)  # nseqs whose hold/refusal was logged
    decided: int = 0  # while connected: the highest nseq already decided
    epoch: int = 0  # a running plan of another epoch is stale
    looking: bool = False  # one look at a time
    again: bool | None = None  # kicked during its look: connected, as last said
    retry_armed: bool = False  # a held decision's retry is pending
    untold: list[bytes] = field(default_factory=list)  # limit frames waiting for IP
    told: set[tuple[str, float]] = field(default_factory=set)  # (limit, period end) told
    ip_seen: tuple[int, int] = (0, 0)  # RUDP (sent, retransmitted) at the last sample


# ---------------------------------------------------------------------------- commands out


@dataclass(frozen=True, slots=True)
class StartLook:
    """Start a look at ``uri``'s queue (``connected``: its IP channel is up)."""

    uri: str
    connected: bool


@dataclass(frozen=True, slots=True)
class ArmRetry:
    """Kick ``uri`` again in ``delay`` seconds (a held decision's deadline)."""

    uri: str
    delay: float


@dataclass(frozen=True, slots=True)
class CancelRetry:
    uri: str


@dataclass(frozen=True, slots=True)
class CancelBuffers:
    """Cancel these SMS buffers of ``uri`` (IP delivers their notifications)."""

    uri: str
    buffer_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TellLater:
    """Send ``frames`` to ``uri`` over IP once its CONNECTED status is in place."""

    uri: str
    frames: tuple[bytes, ...]


SmsCommand = StartLook | ArmRetry | CancelRetry | CancelBuffers | TellLater


@dataclass(frozen=True, slots=True)
class LookFrom:
    """Where a look starts: the plan's epoch, the nseq after which it decides, and the
    nseqs already on their way by SMS."""

    epoch: int
    after: int
    flying: frozenset[int]


# ---------------------------------------------------------------------------- the records


class SmsSessions:
    """Every user's SMS fallback fields; see the module docstring."""

    def __init__(self) -> None:
        self._records: dict[str, SmsSession] = {}

    def get(self, uri: str) -> SmsSession | None:
        return self._records.get(uri)

    def _rec(self, uri: str) -> SmsSession:
        rec = self._records.get(uri)
        if rec is None:
            rec = self._records[uri] = SmsSession(uri)
        return rec

    def in_flight(self, uri: str) -> tuple[int, ...]:
        """nseqs of ``uri`` on their way by SMS."""
        rec = self._records.get(uri)
        return () if rec is None else tuple(sorted(rec.flying))

    # ------------------------------------------------------------------ looks

    def kicked(self, uri: str, *, connected: bool) -> list[SmsCommand]:
        """Something may be decided for ``uri``: a look now, or one more after the
        running one (which then knows which notifications are on their way)."""
        rec = self._rec(uri)
        if rec.looking:
            rec.again = connected
            return []
        rec.looking = True
        return [StartLook(uri, connected)]

    def look_from(self, uri: str, *, connected: bool) -> LookFrom:
        """A look at ``uri`` plans now: its starting point."""
        rec = self._rec(uri)
        after = rec.decided if connected else 0
        return LookFrom(rec.epoch, after, frozenset(rec.flying))

    def planned(self, uri: str, epoch: int, *, connected: bool, decided: int) -> bool:
        """The plan of a look started at ``epoch`` came back, up to nseq ``decided``:
        True if it is stale (only its deletions stand)."""
        rec = self._rec(uri)
        stale = rec.epoch != epoch
        if connected and not stale:
            rec.decided = max(rec.decided, decided)
        return stale

    def look_again(self, uri: str) -> bool | None:
        """The look's plan is carried out: ``connected`` for one more (kicked
        meanwhile), else None."""
        rec = self._rec(uri)
        again, rec.again = rec.again, None
        return again

    def look_ended(self, uri: str) -> None:
        """The look at ``uri`` ended (done, failed or cancelled)."""
        rec = self._rec(uri)
        rec.looking = False
        rec.again = None

    # ------------------------------------------------------------------ its steps

    def sent(self, uri: str, nseq: int, buffer_id: int) -> None:
        self._rec(uri).flying[nseq] = buffer_id

    def buffer_done(self, uri: str, nseq: int) -> None:
        """``uri``'s ``nseq`` was acknowledged by SMS or expired."""
        rec = self._records.get(uri)
        if rec is not None:
            rec.flying.pop(nseq, None)

    def noted(self, uri: str, nseq: int) -> bool:
        """True the first time ``nseq``'s hold or refusal is noted (it is logged once)."""
        rec = self._rec(uri)
        if nseq in rec.noted:
            return False
        rec.noted.add(nseq)
        return True

    def told(self, uri: str, limit: str, until: float) -> bool:
        """True the first time ``uri`` is told of ``limit`` for the period ending at
        ``until``."""
        rec = self._rec(uri)
        key = (limit, until)
        if key in rec.told:
            return False
        rec.told.add(key)
        return True

    def untold(self, uri: str, frames: list[bytes]) -> None:
        """``frames`` could not be sent over IP now: they go when IP is back."""
        self._rec(uri).untold.extend(frames)

    def retry(self, uri: str, delay: float) -> list[SmsCommand]:
        """A decision is held ``delay`` seconds: one retry per user at a time."""
        rec = self._rec(uri)
        if rec.retry_armed:
            return []
        rec.retry_armed = True
        return [ArmRetry(uri, max(0.0, delay))]

    def retry_due(self, uri: str) -> None:
        """The retry fired: what was held or refused is decided again."""
        rec = self._rec(uri)
        rec.retry_armed = False
        rec.noted.clear()
        rec.decided = 0

    def retry_dropped(self, uri: str) -> None:
        """The SMS side closed: ``uri``'s retry timer is gone, nothing is decided again."""
        rec = self._records.get(uri)
        if rec is not None:
            rec.retry_armed = False

    # ------------------------------------------------------------------ connection state

    def ip_back(self, uri: str) -> list[SmsCommand]:
        """IP proved to work for ``uri`` again: a running plan is stale, its buffers
        stop (IP delivers what is queued), the limits reached meanwhile are told."""
        rec = self._rec(uri)
        out = self._redecide(rec)
        flying, rec.flying = rec.flying, {}
        if flying:
            out.append(CancelBuffers(uri, tuple(flying.values())))
        if rec.untold:
            out.append(TellLater(uri, tuple(rec.untold)))
            rec.untold = []
        return out

    def calendar_changed(self, uri: str) -> list[SmsCommand]:
        """``uri``'s device sent a new calendar: a running plan is stale and what is
        held or refused is decided again."""
        return self._redecide(self._rec(uri))

    def _redecide(self, rec: SmsSession) -> list[SmsCommand]:
        out: list[SmsCommand] = []
        if rec.retry_armed:
            rec.retry_armed = False
            out.append(CancelRetry(rec.uri))
        rec.epoch += 1
        rec.noted.clear()
        rec.decided = 0
        return out

    def ip_sample(self, uri: str, sent: int, retransmitted: int) -> float | None:
        """``uri``'s RUDP counters now: the share of the packets sent since the last
        sample that needed no retransmission (None: none sent)."""
        rec = self._rec(uri)
        last_sent, last_re = rec.ip_seen
        if sent < last_sent or retransmitted < last_re:
            last_sent, last_re = 0, 0  # a new RUDP association: counters restarted
        rec.ip_seen = (sent, retransmitted)
        new_sent = sent - last_sent
        if new_sent <= 0:
            return None
        return 1.0 - min(new_sent, retransmitted - last_re) / new_sent


__all__ = [
    "ArmRetry",
    "CancelBuffers",
    "CancelRetry",
    "LookFrom",
    "SmsCommand",
    "SmsSession",
    "SmsSessions",
    "StartLook",
    "TellLater",
]
