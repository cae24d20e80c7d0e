"""Requests to the broker awaiting their answer, and the publishes of the outbox.

:class:`Requests` numbers the agent's requests (``req``), keeps each until its answer
or its deadline, and owns the outbox's durability point: a publish is in the outbox,
durably, before it is sent. :meth:`Requests.publish` writes it and holds the frame;
:meth:`Requests.sync` fsyncs once for all the held ones and sends them. After each
connection, or once the broker is heard from after a publish got no answer,
:meth:`Requests.flush` sends the outbox again, oldest first, with the same ``msg_id``
(the broker dedupes by it). ``pub-ok`` takes a publish out of the outbox
(:meth:`Requests.settled`), and so does an ``error`` that its application awaits or
that is final (below 500); a publish the application was told is pending stays on a
temporary refusal. A publish without an answer, or one that stays on a temporary
refusal, goes again :data:`RESEND_AFTER` seconds later in the same connection (or at
once when a frame shows the broker answers again): a publisher that subscribes to
nothing may hear nothing else from the broker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mdeci.agent.errors import AgentError, StateError
from mdeci.agent.events import RequestFailed, Sink
from mdeci.agent.files import KnownSub, OutboxFile, OutgoingPub
from mdeci.frames import AttrValue, Calendar, Frame, List, Pub, Renew, Sub, Unsub

RequestFrame = Sub | Unsub | Renew | List | Pub | Calendar

RESEND_AFTER = 5.0  # seconds before the outbox goes again after no answer or a 5xx


@dataclass(slots=True)
class Pending:
    """A request sent (or held for the outbox's fsync) and not answered yet."""

    frame: RequestFrame
    deadline: float
    sent_at: float = 0.0  # when it was sent (or held for the fsync)
    probe: bool = False  # the list that proves the media path after an INVITE
    restore: KnownSub | None = None  # a subscription sent again (new store, lapsed lease)
    renew: KnownSub | None = None  # the lease this renew extends
    fixed: bool = False  # an application's sub that asked for a fixed lifetime
    awaited: bool = False  # a publish whose application waits for this answer


class Requests:
    """The agent's requests in flight; frames go out through ``send``."""

    def __init__(
        self,
        outbox: OutboxFile,
        send: Callable[[Frame], None],
        sink: Sink,
        alert: Callable[[str, str], None],
        response_timeout: float,
    ) -> None:
        self._outbox = outbox
        self._send = send
        self._sink = sink
        self._alert = alert
        self.response_timeout = response_timeout
        self._pending: dict[int, Pending] = {}
        self._req = 0
        self._held: list[Pub] = []  # publishes written, waiting for sync
        # A publish got no answer in time: its fate is unknown until the broker is heard
        # from again (resend_unanswered) or the next connection (flush).
        self._unanswered = False
        self._resend_at: float | None = None  # when the outbox goes again (connected)
        # Until when (``now``'s clock) a publish of the outbox waits for a cheaper
        # network, None: it goes now. The core sets it (mdeci.agent.device).
        self.hold: Callable[[OutgoingPub, float], float | None] = _never
        self._waiting: dict[str, float] = {}  # msg_id -> until, publishes held by `hold`

    def next_req(self) -> int:
        self._req += 1
        return self._req

    def deadline(self) -> float | None:
        """The earliest deadline of a request in flight, of the outbox's next resend, or
        of a publish's wait for a network."""
        times = [p.deadline for p in self._pending.values()]
        if self._resend_at is not None:
            times.append(self._resend_at)
        if self._waiting:
            times.append(min(self._waiting.values()))
        return min(times, default=None)

    @property
    def waiting(self) -> tuple[str, ...]:
        """The msg_ids of the publishes that wait for a cheaper network."""
        return tuple(self._waiting)

    def request(
        self,
        now: float,
        frame: RequestFrame,
        *,
        probe: bool = False,
        restore: KnownSub | None = None,
        renew: KnownSub | None = None,
        fixed: bool = False,
        hold: bool = False,
        awaited: bool = False,
    ) -> int:
        """Send ``frame`` (``hold``: a publish, sent by :meth:`sync`); its ``req``."""
        self._pending[frame.req] = Pending(
            frame,
            now + self.response_timeout,
            now,
            probe=probe,
            restore=restore,
            renew=renew,
            fixed=fixed,
            awaited=awaited,
        )
        if hold:
            assert isinstance(frame, Pub)
            self._held.append(frame)
        else:
            self._send(frame)
        return frame.req

    def answered(self, req: int) -> Pending | None:
        """The request ``req`` answers (None: not ours, or given up)."""
        return self._pending.pop(req, None)

    def expired(self, now: float) -> list[tuple[int, Pending]]:
        """The requests whose deadline passed, no longer in flight."""
        out = [(req, p) for req, p in self._pending.items() if p.deadline <= now]
        for req, p in out:
            del self._pending[req]
            if isinstance(p.frame, Pub):
                self._unanswered = True
                self.resend_later(now)
        return out

    def fail_all(self, error: AgentError) -> None:
        """No answer will come (connection lost, closing): every request fails.

        A held publish is answered now ("buffered"): durable first. It stays in the
        outbox and goes with the others after the next connection.
        """
        held, self._held = self._held, []
        self._durable(held)
        pending, self._pending = self._pending, {}
        for req in pending:
            self._sink(RequestFailed(req, error))

    # ------------------------------------------------------------------ publishes

    def publish(
        self,
        now: float,
        msg_id: str,
        subject: str,
        attrs: Mapping[str, AttrValue] | None,
        payload: bytes,
        *,
        urgent: bool,
        connected: bool,
        qclass: str = "",
        wall: float = 0.0,
    ) -> int | None:
        """Buffer durably, then (``connected``) send: the request's ``req`` or None.

        Raises :class:`~mdeci.errors.FrameError` (bad subject or attributes; nothing
        stored), :class:`StateError`.
        """
        frame = Pub(
            req=0,
            msg_id=msg_id,
            subject=subject,
            attrs=dict(attrs or {}),
            payload=payload,
            urgent=urgent,
            qclass=qclass,
        )  # validates before anything is stored
        pub = OutgoingPub(
            msg_id=msg_id,
            subject=subject,
            attrs=frame.attrs,
            payload=payload,
            urgent=urgent,
            qclass=qclass,
            queued_at=wall,
        )
        if not connected or self._held_back(now, pub):
            self._outbox.add(pub)  # durable now: the application is answered now
            return None
        # Written now, made durable (with the other publishes of this loop turn) by
        # sync, which sends it then: never on the wire before it is durable.
        self._outbox.add(pub, sync=False)
        return self._send_pub(now, pub, hold=True, awaited=True)

    def sync(self) -> None:
        """The durable point for publishes: one fsync for those buffered since the last
        one, then they are sent, in order."""
        held, self._held = self._held, []
        if not self._durable(held):
            return
        for frame in held:
            if frame.req in self._pending:  # not failed meanwhile
                self._send(frame)

    def _durable(self, held: Sequence[Pub]) -> bool:
        """fsync the outbox; if that fails the held publishes fail (the application is
        told) and are not sent again: it may publish them anew."""
        try:
            self._outbox.sync()
        except StateError as exc:
            self._alert("state", str(exc))
            for frame in held:
                if self._pending.pop(frame.req, None) is not None:
                    self._sink(RequestFailed(frame.req, exc))
                with contextlib.suppress(StateError):
                    self._outbox.done(frame.msg_id)
            return False
        return True

    def resend_unanswered(self, now: float) -> None:
        """The broker is heard from: if a publish got no answer, send the outbox again
        (:meth:`flush`)."""
        if self._unanswered:
            self.flush(now)

    def resend_later(self, now: float) -> None:
        """Send the outbox again :data:`RESEND_AFTER` seconds from ``now`` (if not sooner)."""
        if self._resend_at is None:
            self._resend_at = now + RESEND_AFTER

    def _held_back(self, now: float, pub: OutgoingPub) -> bool:
        until = self.hold(pub, now)
        if until is None or until <= now:
            self._waiting.pop(pub.msg_id, None)
            return False
        self._waiting[pub.msg_id] = until
        return True

    def timer(self, now: float, *, connected: bool) -> None:
        """The outbox's resend, or a publish's wait, is due: the outbox goes if connected
        (the next connection sends it otherwise)."""
        if self._waiting and min(self._waiting.values()) <= now:
            if connected:
                self.flush(now)
                return
            self._waiting = {k: t for k, t in self._waiting.items() if t > now}
        if self._resend_at is None or now < self._resend_at:
            return
        if connected:
            self.flush(now)
        else:
            self._resend_at = None

    def flush(self, now: float) -> None:
        """Send the buffered publishes again, oldest first, with their msg_id."""
        self._unanswered = False
        self._resend_at = None
        waiting = {p.frame.msg_id for p in self._pending.values() if isinstance(p.frame, Pub)}
        for pub in self._outbox.pending():
            if pub.msg_id not in waiting and not self._held_back(now, pub):
                self._send_pub(now, pub)

    def stop_awaiting(self, req: int) -> None:
        """The application no longer waits for publish ``req``'s answer (it was told the
        publish is pending)."""
        pending = self._pending.get(req)
        if pending is not None:
            pending.awaited = False

    def _send_pub(
        self, now: float, pub: OutgoingPub, *, hold: bool = False, awaited: bool = False
    ) -> int:
        frame = Pub(
            req=self.next_req(),
            msg_id=pub.msg_id,
            subject=pub.subject,
            attrs=pub.attrs,
            payload=pub.payload,
            urgent=pub.urgent,
            qclass=pub.qclass,
        )
        return self.request(now, frame, hold=hold, awaited=awaited)

    def settled(self, pub: Pub) -> None:
        """The broker's answer settles ``pub`` (accepted, or refused and the application
        told): not to be sent again."""
        self._waiting.pop(pub.msg_id, None)
        try:
            self._outbox.done(pub.msg_id)
        except StateError as exc:
            self._alert("state", str(exc))


def _never(pub: OutgoingPub, now: float) -> float | None:
    return None
