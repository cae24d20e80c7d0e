"""Notifications held for a cheaper network (sans-IO): the broker's half of the thesis'
"wait for Wi-Fi" decision on the IP path.

Theory of operation (docs/channels.md "Networks as channels"). The device tells which
access-network kind carries its traffic (the ``device`` frame, at every session start and
move) and its weekly calendar (the ``calendar`` frame). While a device is on a network
that a cheaper one may replace (its calendar gives one a probability above 0) some
classes may wait: before the IP path sends a notification, :meth:`NetworkHolds.decide`
asks :func:`mdeci.channels.networks.decide` with the user's policy (the broker's
``[[channels.networks]]``, the device's best figures and battery, the ``[channels]``
classes). A :class:`~mdeci.channels.networks.Wait` keeps the notification here by
``nseq``; anything else lets it go. Every decision is logged (``channel_decided``).

A held notification is decided again when the device reports another network
(:meth:`NetworkHolds.device`: on one it waited for it goes at once) and at its ``until``
(:meth:`NetworkHolds.due`: then the current network is the best there is). What this
gives back are the nseqs to send now; the delivery sends them out of ``nseq`` order
(:mod:`mdeci.broker.delivery`), except within an in-order subscription (docs/channels.md
"The order"): there a notification that would go while an earlier one of the same
subscription is held is held too, and the earlier ones are released with it (the next
take reads from the lowest of them, in ``nseq`` order). A later one thus never overtakes a
held one, and a deadline or an urgent one is still kept: it pulls the earlier ones along.
Holds are kept in memory: after a broker restart the IP path sends what was held (nothing
is lost; it may go on the costly network).

SMS stays the SMS side's (:mod:`mdeci.broker.sms`): here the channels are the networks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mdeci.broker.sink import ChurnSink
from mdeci.channels import MemoryUsage, Outgoing, WeeklyCalendar
from mdeci.channels.model import ClassPolicy
from mdeci.channels.networks import (
    Best,
    Deliver,
    DeviceReport,
    Network,
    NetworkDecision,
    Wait,
    decide,
    describe,
    network_policy,
)
from mdeci.frames import Device
from mdeci.store.queue_rows import DeliveryRow, RowClass

#: How far below a notification being sent a held one may stay. The agent accepts a
#: number below the highest it has only within its window (``[sms] window``, 1024 by
#: default): a held notification that would fall out of it goes now instead.
MAX_HOLD_SPAN = 512


@dataclass(frozen=True, slots=True)
class Held:
    """One held notification: what was decided for it, and the message decided for."""

    message: Outgoing
    wait: Wait
    sub_id: int = 0  # its subscription (what the in-order option is per)


class NetworkHolds:
    """Per user: the device's report and calendar, and the notifications held."""

    def __init__(
        self,
        networks: tuple[Network, ...],
        classes: Mapping[str, ClassPolicy],
        log: ChurnSink,
        clock: Callable[[], float],
        *,
        urgent_class: str = "urgent",
        default_class: str = "normal",
        sub_class: Callable[[int], str | None] = lambda sub_id: None,
        sub_in_order: Callable[[int], bool] = lambda sub_id: False,
    ) -> None:
        self.networks = networks
        self.urgent_class = urgent_class
        self.default_class = default_class
        self.sub_class = sub_class
        self.sub_in_order = sub_in_order
        self.classes = dict(classes)
        self.log = log
        self.clock = clock
        self._reports: dict[str, DeviceReport] = {}
        self._calendars: dict[str, WeeklyCalendar] = {}
        self._held: dict[str, dict[int, Held]] = {}
        self._usage = MemoryUsage()  # networks carry no limits; SMS's are the SMS side's
        self._waits = any(c.max_delay > 0 for c in self.classes.values())
        #: The earliest ``until`` of what is held (None: nothing), kept after each change
        #: on the owner's thread: a timer on another thread reads it to know whether to
        #: call :meth:`due` (one attribute read, no walk of the dicts).
        self.earliest: float | None = None

    # ------------------------------------------------------------------ inputs

    def device(self, uri: str, frame: Device) -> list[int]:
        """The device reports ``frame``; the held nseqs to send now (in order)."""
        self._reports[uri] = DeviceReport(
            network=frame.network or None,
            best={
                b.network: Best(latency_ms=b.latency_ms, coverage=b.coverage) for b in frame.best
            },
            battery=None if frame.battery < 0 else frame.battery,
        )
        return self._again(uri, self.clock())

    def calendar(self, uri: str, calendar: WeeklyCalendar) -> list[int]:
        """The device's new calendar; the held nseqs to send now."""
        self._calendars[uri] = calendar
        return self._again(uri, self.clock())

    def drop(self, uri: str, nseq: int) -> None:
        """Notification ``nseq`` left the queue another way (SMS, its TTL)."""
        held = self._held.get(uri)
        if held is not None:
            held.pop(nseq, None)
            if not held:
                del self._held[uri]
            self._changed()

    def forget(self, uri: str) -> None:
        """The user's rows are gone or its session ended: nothing is held for it."""
        self._held.pop(uri, None)
        self._changed()

    # ------------------------------------------------------------------ queries

    def may_hold(self, uri: str) -> bool:
        """Whether a notification of ``uri`` may be held now (else every one goes, and
        nothing is decided: the IP path's fast path)."""
        report = self._reports.get(uri)
        return (
            self._waits
            and report is not None
            and report.network is not None
            and uri in self._calendars
        )

    def any_held(self) -> bool:
        return bool(self._held)

    def held(self, uri: str) -> Mapping[int, Held]:
        return self._held.get(uri, {})

    def lowest(self, uri: str) -> int | None:
        """The lowest nseq held for ``uri`` (acks below it only reach the store)."""
        held = self._held.get(uri)
        return min(held) if held else None

    def next_deadline(self) -> float | None:
        return min(
            (h.wait.until for held in self._held.values() for h in held.values()), default=None
        )

    # ------------------------------------------------------------------ decisions

    def class_of(self, row: RowClass) -> str:
        """A row's class: its publish's, else its subscription's, else by ``urgent``
        (docs/channels.md "The class")."""
        return (
            row.qclass
            or self.sub_class(row.sub_id)
            or (self.urgent_class if row.urgent else self.default_class)
        )

    def decide(self, uri: str, nseq: int, message: Outgoing, sub_id: int = 0) -> list[int]:
        """Decide for notification ``nseq`` of subscription ``sub_id``: ``[]`` when it
        goes now; ``[nseq]`` when it is held; more when it is of an in-order subscription
        with earlier ones held: they and it, to release together (in ``nseq`` order)."""
        report = self._reports.get(uri)
        network = report.network if report is not None else None
        decision = self._decide(uri, message)
        self._logged(uri, nseq, message, network, decision)
        if isinstance(decision, Wait):
            self._held.setdefault(uri, {})[nseq] = Held(message, decision, sub_id)
            self._changed()
            return [nseq]
        if sub_id and self.sub_in_order(sub_id):
            before = self._pull(uri, network, sub_id, nseq)
            if before:
                return [*before, nseq]
        return []

    def _pull(self, uri: str, network: str | None, sub_id: int, upto: int) -> list[int]:
        """The held nseqs of ``sub_id`` below ``upto``, which goes now: no longer held,
        each logged as delivered on the current network (``why=in_order``)."""
        held = self._held.get(uri)
        if not held:
            return []
        out = sorted(n for n, h in held.items() if h.sub_id == sub_id and n < upto)
        return self._let_go(uri, held, out, network, "in_order")

    def _changed(self) -> None:
        self.earliest = self.next_deadline()

    def due(self) -> dict[str, list[int]]:
        """At a deadline: per user, the held nseqs to send now."""
        now = self.clock()
        out: dict[str, list[int]] = {}
        for uri in [
            u for u, held in self._held.items() if any(h.wait.until <= now for h in held.values())
        ]:
            released = self._again(uri, now)
            if released:
                out[uri] = released
        return out

    def too_far(self, uri: str, nseq: int) -> list[int]:
        """Held nseqs more than :data:`MAX_HOLD_SPAN` below ``nseq``, which goes now:
        they go too (no longer held)."""
        held = self._held.get(uri)
        if not held:
            return []
        out = sorted(n for n in held if n < nseq - MAX_HOLD_SPAN)
        report = self._reports.get(uri)
        network = report.network if report is not None else None
        return self._let_go(uri, held, out, network, "reorder_window")

    def _let_go(
        self, uri: str, held: dict[int, Held], nseqs: list[int], network: str | None, why: str
    ) -> list[int]:
        """``nseqs`` of ``uri``'s ``held`` go now on the current network: no longer held,
        each logged as delivered there with ``why``."""
        for n in nseqs:
            message = held.pop(n).message
            decision = Deliver(network or "", 0.0, 0.0)
            reason = describe(decision, network=network, qclass=message.qclass)
            self.log.emit(
                "channel_decided", uri, channel="ip", nseq=n, bytes=message.size,
                cost=self._cost_on(network, message.size), reason=f"{reason} why={why}",
            )  # fmt: skip
        if not held:
            del self._held[uri]
        self._changed()
        return nseqs

    def _again(self, uri: str, now: float) -> list[int]:
        held = self._held.get(uri)
        if not held:
            return []
        report = self._reports.get(uri)
        network = report.network if report is not None else None
        released = []
        # In an in-order subscription, what goes takes the earlier held ones along.
        last: dict[int, int] = {}
        for nseq, entry in sorted(held.items()):
            decision = self._decide(uri, entry.message, now)
            if isinstance(decision, Wait):
                held[nseq] = Held(entry.message, decision, entry.sub_id)
                continue
            del held[nseq]
            released.append(nseq)
            self._logged(uri, nseq, entry.message, network, decision)
            if entry.sub_id and self.sub_in_order(entry.sub_id):
                last[entry.sub_id] = nseq
        for sub_id, upto in last.items():
            if uri in self._held:
                released += self._pull(uri, network, sub_id, upto)
        if not held:
            self._held.pop(uri, None)
        self._changed()
        return sorted(released)

    def _decide(self, uri: str, message: Outgoing, now: float | None = None) -> NetworkDecision:
        report = self._reports.get(uri)
        if message.qclass not in self.classes:
            return Deliver(report.network if report and report.network else "", 0.0, 0.0)
        policy = network_policy(self.networks, self.classes, report=report)
        return decide(
            policy,
            message,
            network=report.network if report is not None else None,
            sms=False,
            usage=self._usage,
            now=self.clock() if now is None else now,
            calendar=self._calendars.get(uri),
        )

    def _cost_on(self, network: str | None, size: int) -> float | None:
        """What ``size`` bytes cost on ``network`` (None: not a configured one)."""
        return next((n.channel().cost(size) for n in self.networks if n.kind == network), None)

    def _logged(
        self,
        uri: str,
        nseq: int,
        message: Outgoing,
        network: str | None,
        decision: NetworkDecision,
    ) -> None:
        if isinstance(decision, Deliver):
            cost: float | None = decision.cost
        elif isinstance(decision, Wait):
            # What it would have cost on the network it is on now: the wait saves this
            # less the cost of the line that delivers it.
            cost = self._cost_on(network, message.size)
        else:
            cost = None
        self.log.emit(
            "channel_decided",
            uri,
            channel="ip",
            nseq=nseq,
            bytes=message.size,
            cost=cost,
            reason=describe(decision, network=network, qclass=message.qclass),
        )


class Gate:
    """One take's network decision for a user's rows: a row goes unless it is held (or
    decided now to be held), already in flight (a take after a release reads from the
    lowest released one again), or already acknowledged (its row stays in the store
    while a lower one is held)."""

    def __init__(
        self,
        holds: NetworkHolds,
        uri: str,
        inflight: Mapping[int, float],
        released: set[int],
        acked: int,
        fresh: tuple[int, ...],
    ) -> None:
        self.holds = holds
        self.uri = uri
        self.inflight = inflight
        self.released = released
        self.acked = acked
        self.fresh = fresh  # the nseqs to decide for (their classes are read)
        self.classes: dict[int, str] = {}
        self.overdue: list[int] = []  # held ones too far below what goes (MAX_HOLD_SPAN)

    @classmethod
    def prepare(
        cls,
        holds: NetworkHolds,
        uri: str,
        inflight: Mapping[int, float],
        rows: Sequence[DeliveryRow],
        released_of: dict[str, set[int]],
        acked: int,
    ) -> Gate:
        """The gate of ``rows`` (read after the link's ``sent_upto``); a released nseq
        this read should have found and did not is gone (SMS, its TTL) and is dropped
        from ``released_of``."""
        held = holds.held(uri)
        released = released_of.get(uri, set())
        last = rows[-1][0] if rows else None
        present = {r[0] for r in rows}
        released -= {
            n
            for n in released
            if n not in present and n not in inflight and (last is None or n <= last)
        }
        if not released:
            released_of.pop(uri, None)
        fresh = tuple(
            r[0]
            for r in rows
            if r[0] not in held and r[0] not in released and r[0] not in inflight and r[0] > acked
        )
        return cls(holds, uri, inflight, released, acked, fresh)

    def classify(self, rows: Sequence[RowClass]) -> None:
        self.classes = {rc.nseq: self.holds.class_of(rc) for rc in rows}

    def skip(self, row: DeliveryRow) -> bool:
        """Whether ``row`` stays back in this take."""
        nseq = row[0]
        if nseq in self.inflight:
            return True
        if nseq in self.released:
            return False
        if nseq <= self.acked or nseq in self.holds.held(self.uri):
            return True
        qclass = self.classes.get(nseq)
        if qclass is not None:
            size = NOTIFY_ROW_OVERHEAD + len(row[4]) + len(row[5]) + len(row[6])
            message = Outgoing(user=self.uri, qclass=qclass, size=size, first_seen=row[7])
            kept = self.holds.decide(self.uri, nseq, message, row[1])
            if len(kept) > 1:  # in order: it goes after the held ones it pulled
                self.overdue += kept
            if kept:
                return True
        self.overdue += self.holds.too_far(self.uri, nseq)
        return False


#: What a notify frame adds to a row's subject, attributes and payload, about.
NOTIFY_ROW_OVERHEAD = 96
