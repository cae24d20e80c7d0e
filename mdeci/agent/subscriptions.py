"""The agent's subscriptions: its record, kept in step with the broker's answers, and
their leases (docs/agent.md "Subscription leases").

The record (``subs.json``) holds, per ``sub_id``, what was asked (subject, filter, queue
class, TTL) and whether the application wants it kept alive (a lease) or asked for a
fixed lifetime; the broker's ``subs`` list carries neither, so they are kept here. With
it the agent renews a lease before it expires (``renew``, timed by
:class:`~mdeci.agent.leases.LeaseTable`), subscribes again one that lapsed while the
broker could not be reached, and sends every subscription again when the broker's store
is a new one (which has none of them).

Every end of a subscription (its TTL for a fixed one, a refused renewal, the broker no
longer listing it, an ``unsub``) and every replacement by a new ``sub_id`` is a
:class:`~mdeci.agent.events.SubscriptionChanged` event; the latest ends stay listed
(:meth:`SubsBook.states`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from mdeci.agent.errors import StateError
from mdeci.agent.events import LeaseRenewed, Sink, SubscriptionChanged
from mdeci.agent.files import KnownSub, SubsFile
from mdeci.agent.leases import LeaseTable
from mdeci.agent.requests import Pending, Requests
from mdeci.frames import Error, Frame, Renew, Sub, SubInfo, SubOk, Unsub

ENDED_KEPT = 100  # ended subscriptions listed by ``subs`` (memory only)
ALIVE_LIFETIME = 1.0  # seconds assumed left of a listed one our wall clock calls expired
LAPSED = "expired before a renewal reached the broker: subscribed again"
STORE_REPLACED = "the broker's store was replaced: subscribed again"


@dataclass(frozen=True, slots=True)
class SubState:
    """A subscription as ``mdeci subs`` shows it: ``state`` ``live``, ``pending`` (being
    subscribed again: ``reason`` says why) or ``ended`` (``reason`` says why)."""

    sub_id: str
    subject: str
    filter: str
    expires_at: float
    lease: bool
    state: str
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "sub_id": self.sub_id,
            "subject": self.subject,
            "filter": self.filter,
            "expires_at": self.expires_at,
            "lease": self.lease,
            "state": self.state,
            "reason": self.reason,
        }


class SubsBook:
    """The record and the leases; requests go out through ``requests``, events to
    ``sink``; a failed write of the record is an alert (``state``), not an error."""

    def __init__(
        self,
        record: SubsFile,
        requests: Requests,
        sink: Sink,
        alert: Callable[[str, str], None],
    ) -> None:
        self._record = record
        self._requests = requests
        self._sink = sink
        self._alert = alert
        self._leases = LeaseTable()
        self._again: dict[str, str] = {}  # sub_id -> why it is being subscribed again
        self._ended: deque[SubState] = deque(maxlen=ENDED_KEPT)

    # ------------------------------------------------------------------ observing

    @property
    def items(self) -> tuple[KnownSub, ...]:
        return self._record.items

    @property
    def leases(self) -> LeaseTable:
        return self._leases

    def infos(self) -> tuple[SubInfo, ...]:
        return tuple(
            SubInfo(sub_id=s.sub_id, subject=s.subject, filter=s.filter, expires_at=s.expires_at)
            for s in self._record.items
        )

    def states(self) -> tuple[SubState, ...]:
        """The recorded subscriptions, then the latest ended ones (oldest first)."""
        live = tuple(
            SubState(
                s.sub_id,
                s.subject,
                s.filter,
                s.expires_at,
                s.lease,
                "pending" if s.sub_id in self._again else "live",
                self._again.get(s.sub_id, ""),
            )
            for s in self._record.items
        )
        return (*live, *self._ended)

    def deadline(self, *, connected: bool) -> float | None:
        return self._leases.deadline(connected=connected)

    # ------------------------------------------------------------------ requests

    def subscribe(
        self,
        now: float,
        subject: str,
        filter: str,
        ttl: int | None,
        qclass: str,
        *,
        fixed: bool,
        in_order: bool = False,
    ) -> int:
        """Send the application's ``sub``; its ``req``. Raises :class:`FrameError`."""
        req = self._requests.next_req()
        frame = Sub(
            req=req, subject=subject, filter=filter, ttl=ttl, qclass=qclass, in_order=in_order
        )
        return self._requests.request(now, frame, fixed=fixed)

    def unsubscribe(self, now: float, sub_id: str) -> int:
        """Send ``unsub``; its ``req``. Raises :class:`FrameError`."""
        return self._requests.request(now, Unsub(req=self._requests.next_req(), sub_id=sub_id))

    def _send_again(self, now: float, known: KnownSub, wall: float | None = None) -> bool:
        """Subscribe ``known`` again (a new ``sub_id`` will replace it); False when it is
        a fixed one whose TTL is reached meanwhile (it ends). A fixed one keeps its end:
        the broker's ``expires_at`` less ``wall``, else the lease's expiry less ``now``."""
        lease = self._leases.get(known.sub_id)
        ttl = known.ttl
        if not known.lease:
            if wall is not None:
                left = math.floor(known.expires_at - wall)
            else:
                left = math.floor(lease.expires - now) if lease is not None else 0
            if left <= 0:
                self._remove(known.sub_id)
                self._end(known, "TTL reached")
                return False
            ttl = left
        frame = Sub(
            req=self._requests.next_req(),
            subject=known.subject,
            filter=known.filter,
            ttl=ttl,
            qclass=known.qclass,
            in_order=known.in_order,
        )
        self._requests.request(now, frame, restore=known)
        return True

    def _flush_again(self, now: float, wall: float | None = None) -> int:
        """Send again what must be subscribed again and is not on its way; how many."""
        sent = 0
        for known in self._record.items:
            if known.sub_id in self._again and self._leases.mark_sending(known.sub_id):
                sent += self._send_again(now, known, wall)
        return sent

    # ------------------------------------------------------------------ the connection

    def _ensure(self, now: float, wall: float, known: KnownSub, *, alive: bool = False) -> None:
        """A lease for ``known`` (one recorded before a restart gets its times now, from
        our wall clock; ``alive``: the broker lists it, so a clock of ours that says it
        expired is wrong: it is renewed soon instead)."""
        if known.sub_id not in self._leases:
            lifetime = known.expires_at - wall
            if alive:
                lifetime = max(lifetime, ALIVE_LIFETIME)
            self._leases.grant(known.sub_id, now, lifetime, fixed=not known.lease)

    def connected(self, now: float, wall: float) -> None:
        """The session is up: leases for the record, then what is due goes out."""
        for known in self._record.items:
            self._ensure(now, wall, known)
        self._flush_again(now, wall)
        self.timer(now, connected=True)

    def restore(self, now: float, wall: float) -> int:
        """The broker's store is a new one: send every recorded subscription again (a
        fixed one for what is left of its TTL); how many were sent."""
        for known in self._record.items:
            self._ensure(now, wall, known)
            self._again[known.sub_id] = STORE_REPLACED
            self._leases.disconnected_one(known.sub_id)
        return self._flush_again(now, wall)

    def lost(self) -> None:
        """The connection is gone: what was on its way gets no answer."""
        self._leases.disconnected()

    def timer(self, now: float, *, connected: bool) -> None:
        due = self._leases.take_due(now, connected=connected)
        mine = {s.sub_id: s for s in self._record.items}
        for sub_id in due.ended:
            known = mine.get(sub_id)
            if known is not None:
                self._remove(sub_id)
                self._end(known, "TTL reached")
        for sub_id in (*due.lapsed, *due.renew):
            known = mine.get(sub_id)
            if known is None:
                self._leases.drop(sub_id)
            elif sub_id in due.lapsed or sub_id in self._again:
                self._again.setdefault(sub_id, LAPSED)
                self._send_again(now, known)
            else:
                frame = Renew(req=self._requests.next_req(), sub_id=sub_id, ttl=known.ttl)
                self._requests.request(now, frame, renew=known)

    # ------------------------------------------------------------------ answers

    def answered(self, now: float, wall: float, pending: Pending, frame: Frame) -> None:
        """The broker answered a request of this book (``sub``, ``renew``, ``unsub``)."""
        sent = pending.frame
        if isinstance(sent, Sub) and isinstance(frame, SubOk):
            self._subscribed(now, wall, sent, frame, pending)
        elif isinstance(sent, Sub) and isinstance(frame, Error) and pending.restore is not None:
            self._refused_again(now, pending.restore, frame)
        elif isinstance(sent, Renew) and pending.renew is not None:
            if isinstance(frame, SubOk):
                self._renewed(now, wall, pending, frame)
            elif isinstance(frame, Error):
                self._refused_renewal(now, pending.renew, frame)
        elif isinstance(sent, Unsub) and not isinstance(frame, Error):
            known = {s.sub_id: s for s in self._record.items}.get(sent.sub_id)
            self._remove(sent.sub_id)
            if known is not None:
                self._end(known, "unsubscribed")

    def failed(self, now: float, pending: Pending) -> None:
        """A request of this book got no answer in time: it goes again later."""
        known = pending.renew or pending.restore
        if known is not None:
            self._leases.failed(known.sub_id, now)

    def _subscribed(self, now: float, wall: float, sent: Sub, ok: SubOk, pending: Pending) -> None:
        again = pending.restore
        known = KnownSub(
            sub_id=ok.sub_id,
            subject=sent.subject,
            filter=sent.filter,
            expires_at=ok.expires_at,
            qclass=sent.qclass,
            in_order=sent.in_order,
            ttl=again.ttl if again is not None else sent.ttl,
            lease=again.lease if again is not None else not pending.fixed,
        )
        old = again.sub_id if again is not None else None
        items = tuple(s for s in self._record.items if s.sub_id not in (old, ok.sub_id))
        self.replace((*items, known))
        self._grant(now, wall, pending, ok, fixed=not known.lease)
        if again is None or old is None or old == ok.sub_id:
            return
        why = self._again.pop(old, LAPSED)
        self._leases.drop(old)
        self._ended.append(_state(again, "ended", f"replaced by {ok.sub_id}: {why}"))
        self._sink(_event(known, "live", why, replaces=old))

    def _grant(self, now: float, wall: float, pending: Pending, ok: SubOk, *, fixed: bool) -> None:
        """Time ``ok``'s lifetime from when its request was sent: the broker counted it
        from later, so the lease never outlives the broker's expiry on our clock (a late
        renewal refused as expired is then seen as lapsed, not as a refusal)."""
        if ok.ttl is not None:
            self._leases.grant(ok.sub_id, pending.sent_at, ok.ttl, fixed=fixed)
        else:  # a broker that does not say: its expiry on our wall clock
            self._leases.grant(ok.sub_id, now, ok.expires_at - wall, fixed=fixed)

    def _renewed(self, now: float, wall: float, pending: Pending, ok: SubOk) -> None:
        sub_id = ok.sub_id
        items = self._record.items
        if not any(s.sub_id == sub_id for s in items):
            return  # cancelled meanwhile
        self.replace(
            tuple(replace(s, expires_at=ok.expires_at) if s.sub_id == sub_id else s for s in items)
        )
        self._grant(now, wall, pending, ok, fixed=False)
        self._sink(LeaseRenewed(sub_id, ok.expires_at))

    def _refused_renewal(self, now: float, known: KnownSub, error: Error) -> None:
        if known.sub_id in self._again:
            return  # sent before the store changed: it is being subscribed again
        if error.code >= 500:  # temporary (the broker's store): try again
            self._leases.failed(known.sub_id, now)
        elif self._leases.lapsed(known.sub_id, now):
            # Sent in time but it arrived late: the lease lapsed, it is not refused.
            self._again[known.sub_id] = LAPSED
            self._send_again(now, known)
        else:
            self._remove(known.sub_id)
            self._end(known, f"renewal refused: {error.code} {error.message}")

    def _refused_again(self, now: float, known: KnownSub, error: Error) -> None:
        if error.code >= 500:
            self._leases.failed(known.sub_id, now)
            return
        why = self._again.pop(known.sub_id, LAPSED).split(":", 1)[0]
        self._remove(known.sub_id)
        self._end(known, f"{why}; subscribing again refused: {error.code} {error.message}")

    # ------------------------------------------------------------------ the broker's list

    def listed(self, now: float, wall: float, items: tuple[SubInfo, ...]) -> None:
        """The broker's list is the truth (with our queue classes, TTLs and leases kept):
        a recorded subscription it lacks has ended, unless it is a lease that lapsed
        (then it is subscribed again)."""
        mine = {s.sub_id: s for s in self._record.items}
        told = {s.sub_id for s in self._ended}
        kept: list[KnownSub] = []
        for item in items:
            known = mine.pop(item.sub_id, None)
            if known is None and item.sub_id in told:
                continue  # ended here a moment before the broker's clock says so
            if known is None:  # not made through this agent: not ours to keep alive
                known = KnownSub(
                    sub_id=item.sub_id,
                    subject=item.subject,
                    filter=item.filter,
                    expires_at=item.expires_at,
                    lease=False,
                )
            kept.append(replace(known, expires_at=item.expires_at))
            self._ensure(now, wall, kept[-1], alive=True)
        for known in mine.values():
            self._ensure(now, wall, known)
            lapsed = self._leases.lapsed(known.sub_id, now)
            if known.sub_id in self._again or (known.lease and lapsed):
                kept.append(known)
            elif lapsed:
                self._end(known, "TTL reached")
            else:
                self._end(known, "no longer at the broker (removed there)")
        self.replace(tuple(kept))

    # ------------------------------------------------------------------ the record

    def _remove(self, sub_id: str) -> None:
        self.replace(tuple(s for s in self._record.items if s.sub_id != sub_id))

    def _end(self, known: KnownSub, reason: str) -> None:
        self._leases.drop(known.sub_id)
        self._again.pop(known.sub_id, None)
        self._ended.append(_state(known, "ended", reason))
        self._sink(_event(known, "ended", reason))

    def replace(self, items: tuple[KnownSub, ...]) -> None:
        try:
            self._record.replace(items)
        except StateError as exc:
            self._alert("state", str(exc))


def _state(known: KnownSub, state: str, reason: str) -> SubState:
    return SubState(
        known.sub_id, known.subject, known.filter, known.expires_at, known.lease, state, reason
    )


def _event(
    known: KnownSub, state: str, reason: str, replaces: str | None = None
) -> SubscriptionChanged:
    return SubscriptionChanged(
        sub_id=known.sub_id,
        state=state,
        reason=reason,
        subject=known.subject,
        filter=known.filter,
        expires_at=known.expires_at,
        lease=known.lease,
        replaces=replaces,
    )
