"""Notifications in: the exactly-once gate and the inbox, one burst at a time.

The glue hands the core what it read in one loop turn; :class:`Intake` passes each
notification through the gate (:meth:`Intake.take`) and records the new ones with one
inbox append and one ``fsync`` (:meth:`Intake.commit`) before it hands them over and
acknowledges them with one cumulative ``ack``.

If the write fails (the state_dir's disk is full), nothing is handed over or acked and
the gate is rolled back. The burst's notifications are kept, unrecorded, and written
again every :data:`RETRY_WRITE` seconds (:meth:`Intake.retry`) and at the head of the
next burst, in ``nseq`` order: the broker sends an unacked notification again only to a
new session, so an agent that waited for it would wait for as long as its session
lasts, and a later burst's cumulative ack must not cover them before they are recorded.
They are held by ``nseq``, so they are bounded by the broker's window (it sends no
more than that unacked). A copy the broker sends again meanwhile meets them in the
gate as a duplicate.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mdeci.agent.errors import StateError
from mdeci.agent.events import ChurnRecord, Delivered, Sink
from mdeci.agent.files import AgentFiles
from mdeci.churnlog import Event, format_ts
from mdeci.frames import Ack, Frame, Notify
from mdeci.sms.dedupe import NseqGate

RETRY_WRITE = 1.0  # seconds between attempts to record notifications the disk refused


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


@dataclass(frozen=True, slots=True)
class Taken:
    """A notification of a recorded burst; ``record`` None: a duplicate."""

    notify: Notify
    channel: str  # "ip" or "sms"
    record: dict[str, Any] | None


class Intake:
    """The burst being read: notifications through the gate, not recorded yet. Frames go
    out through ``send``, events to ``sink``, a failed write to ``alert``."""

    def __init__(
        self,
        files: AgentFiles,
        sink: Sink,
        send: Callable[[Frame], None],
        alert: Callable[[str, str], None],
    ) -> None:
        self._files = files
        self._sink = sink
        self._send = send
        self._alert = alert
        self._burst: list[Taken] = []
        self._gate_before: NseqGate | None = None  # the gate to roll back to
        # nseq -> a notification whose write failed, and when to write it again.
        self._unrecorded: dict[int, tuple[Notify, str]] = {}
        self._retry_at: float | None = None

    def deadline(self) -> float | None:
        """When :meth:`retry` must run (None: nothing waits to be recorded)."""
        return self._retry_at

    def take(self, n: Notify, channel: str) -> None:
        """Pass ``n`` through the gate into the burst; :meth:`commit` records it."""
        if self._gate_before is None:
            self._begin()
        self._pass(n, channel, logged=True)

    def retry(self, now: float, wall: float) -> None:
        """Write the notifications a failed write left unrecorded again, if it is time."""
        if self._retry_at is None or now < self._retry_at:
            return
        self._begin()
        self._commit(now, wall, alert=False)  # the burst's failure was alerted: no repeat

    def _begin(self) -> None:
        """Open a burst: the gate to roll back to, then the unrecorded notifications."""
        self._gate_before = self._files.nseq.gate.copy()
        unrecorded, self._unrecorded = self._unrecorded, {}
        for nseq in sorted(unrecorded):
            self._pass(*unrecorded[nseq], logged=False)  # logged when they first came

    def _pass(self, n: Notify, channel: str, *, logged: bool) -> None:
        record = notification_record(n) if self._files.nseq.gate.accept(n.nseq) else None
        # The gate's refusals and the gaps the broker reported are logged as they are
        # seen, so that the analytics count duplicates and losses per move.
        if logged and record is None:
            self._sink(ChurnRecord(Event.NOTIFY_DUPLICATE, {"nseq": n.nseq, "channel": channel}))
        elif logged and n.missed:
            fields = {"nseq": n.nseq, "channel": channel, "missed": n.missed}
            self._sink(ChurnRecord(Event.NOTIFY_GAP, fields))
        self._burst.append(Taken(n, channel, record))

    def commit(self, now: float, wall: float) -> None:
        """Record the burst's new notifications (one write, one fsync), hand them over,
        then ack: nothing is acked before it is durable. ``wall``: the wall clock, which
        the broker's ``published_at`` is on (the delivery latency logged); ``now``: the
        clock the next attempt is on if the write fails."""
        self._commit(now, wall, alert=True)

    def _commit(self, now: float, wall: float, *, alert: bool) -> None:
        burst, before = self._burst, self._gate_before
        self._burst, self._gate_before = [], None
        if not burst:
            return
        files = self._files
        records = [t.record for t in burst if t.record is not None]
        if records:
            try:
                files.inbox.extend(records)  # the applications have them...
                if files.nseq.per_burst:
                    files.nseq.save()  # ...and a windowed gate's recent numbers too
            except StateError as exc:
                # Not durable: no ack, and the gate forgets them, so that they are taken
                # when written again (and not acked as duplicates, which would lose them).
                assert before is not None
                files.nseq.gate = before
                for taken in burst:
                    held = self._unrecorded.get(taken.notify.nseq)
                    if held is None or taken.channel == "ip":  # only an ip copy is acked
                        self._unrecorded[taken.notify.nseq] = (taken.notify, taken.channel)
                self._retry_at = now + RETRY_WRITE
                if alert:
                    self._alert("state", str(exc))
                return
        self._retry_at = None
        upto = 0
        for taken in burst:
            n = taken.notify
            if taken.record is not None:
                self._sink(Delivered(taken.record))
                latency = max(0.0, (wall - n.published_at) * 1000.0)
                fields = {
                    "nseq": n.nseq,
                    "channel": taken.channel,
                    "latency_ms": latency,
                    "bytes": len(n.payload),
                    "published": format_ts(n.published_at),
                }
                self._sink(ChurnRecord(Event.NOTIFY_DELIVERED, fields))
            if taken.channel == "ip":
                # Up to what came by IP, not the gate's highest: the highest may have
                # come by SMS while older ones still wait for IP. The broker's ack is
                # cumulative, so one for the burst's highest covers the others.
                upto = max(upto, n.nseq)
        if upto:
            self._send(Ack(upto=upto))

    def new_store(self, store_id: str, window: int, archive_as: str) -> bool:
        """The broker's store is ``store_id`` (it numbers from 1 again): an empty gate for
        it, and the inbox archived as ``archive_as`` unless nothing was delivered yet
        under another store. Whether a store was replaced. Raises
        :class:`~mdeci.agent.errors.StateError`.
        """
        nseq = self._files.nseq
        # Unrecorded notifications are numbered by the old store: its successor numbers
        # from 1 again, and sends what it holds.
        self._unrecorded, self._retry_at = {}, None
        replaced = nseq.store_id is not None or nseq.highest > 0
        if replaced:
            self._files.inbox.archive(archive_as)
        nseq.restart(store_id, window)
        return replaced
