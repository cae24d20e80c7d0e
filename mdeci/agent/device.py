"""The device side of channel selection (sans-IO): which access network carries the
agent's traffic, what the agent tells the broker of it, and whether a publish waits.

The thesis runs its channel algorithm "both at the scheduler and at the mobility layer
of the MH". :class:`DeviceSide` is the mobility layer's half. It maps the address that
reaches the broker (and the interface carrying it, when the glue knows it) to a network
kind of ``[network]`` in agent.toml, keeps each kind's best figures (the configured ones,
the latency lowered by RUDP's measured round trips), and builds the ``device`` frame the
core sends at every session start and after each move (with the calendar as a
``calendar`` frame: the ``[calendar]``, or the one an application sent since, which
then stands for the agent's life). For the agent's own publishes it asks
:func:`mdeci.channels.networks.decide` with the classes of
:func:`mdeci.channels.default_classes` (``urgent`` and ``normal`` never wait, ``bulk``
may wait up to an hour): a delay-tolerant publish made on a costly network waits for the
cheaper one the calendar expects, at most until its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from mdeci.channels import MemoryUsage, Outgoing, default_classes
from mdeci.channels.calendar import WeeklyCalendar
from mdeci.channels.networks import (
    Best,
    DeviceReport,
    NetworkDecision,
    Wait,
    decide,
    describe,
    network_policy,
)
from mdeci.config import AgentConfig
from mdeci.frames import Calendar, CalendarRule, Device, NetworkBest

#: The classes the agent decides its own publishes with (a class it does not know is
#: sent at once: the broker decides for it).
AGENT_CLASSES = default_classes()


@dataclass(frozen=True, slots=True)
class PublishDecision:
    """What :meth:`DeviceSide.decide_publish` answered for one publish, with its inputs
    (for the log)."""

    qclass: str
    network: str | None
    decision: NetworkDecision

    @property
    def held_until(self) -> float | None:
        """Wall time until which the publish waits (None: it goes now)."""
        return self.decision.until if isinstance(self.decision, Wait) else None

    def describe(self) -> str:
        return describe(self.decision, network=self.network, qclass=self.qclass)


class DeviceSide:
    """The agent's network, its best figures, and its publishes' decisions."""

    def __init__(self, config: AgentConfig) -> None:
        self._net = config.network
        cal = config.calendar
        rules = tuple(
            CalendarRule(
                channel=r.channel,
                p=r.p,
                weekdays=r.weekday_bits,
                start_hour=r.start_hour,
                end_hour=r.end_hour,
            )
            for r in cal.rules
        )
        self._use(rules, cal.utc_offset_minutes)
        self.networks = tuple(k.network() for k in config.network.kinds)
        self.best = {
            k.kind: Best(latency_ms=k.latency_ms, coverage=k.coverage) for k in config.network.kinds
        }
        self.battery = config.network.battery
        self.network: str | None = None
        self._usage = MemoryUsage()  # the agent enforces no limits of its own

    @property
    def configured(self) -> bool:
        """Whether ``[network]`` names any kind (else the agent decides nothing)."""
        return bool(self.networks)

    def locate(self, address: str | None, interface: str | None = None) -> bool:
        """The agent's traffic now leaves from ``address`` (via ``interface``); whether
        its network kind changed."""
        kind = self._net.kind_of(address, interface)
        changed = kind != self.network
        self.network = kind
        return changed

    def observe_latency(self, latency_ms: float) -> None:
        """A round trip measured on the current network (RUDP's smoothed RTT): kept as
        that kind's best if it is lower."""
        kind = self.network
        best = self.best.get(kind) if kind is not None else None
        if (
            kind is None
            or not latency_ms > 0
            or (best is not None and best.latency_ms <= latency_ms)
        ):
            return
        self.best[kind] = Best(latency_ms=latency_ms, coverage=best.coverage if best else 1.0)

    def report(self) -> Device:
        """The ``device`` frame: network kind, best figures, battery."""
        return Device(
            network=self.network or "",
            best=tuple(
                NetworkBest(network=k, latency_ms=b.latency_ms, coverage=b.coverage)
                for k, b in sorted(self.best.items())
            ),
            battery=-1.0 if self.battery is None else self.battery,
        )

    def calendar_frame(self, req: int) -> Calendar | None:
        """The calendar as a ``calendar`` frame; None without rules."""
        if not self._rules:
            return None
        return Calendar(req=req, rules=self._rules, utc_offset_minutes=self._utc_offset)

    def use_calendar(self, frame: Calendar) -> None:
        """An application's calendar, sent as ``frame``: it replaces the ``[calendar]``
        for the agent's own decisions and for every session start after."""
        self._use(frame.rules, frame.utc_offset_minutes)

    def _use(self, rules: tuple[CalendarRule, ...], utc_offset_minutes: int) -> None:
        # The frame's rules are what is sent; the calendar the decisions read is theirs.
        self._rules, self._utc_offset = rules, utc_offset_minutes
        self.calendar: WeeklyCalendar | None = (
            WeeklyCalendar.from_rules(
                (r.rule() for r in rules), utc_offset_minutes=utc_offset_minutes
            )
            if rules
            else None
        )

    def decide_publish(
        self, qclass: str, *, urgent: bool, size: int, first_seen: float, wall: float
    ) -> PublishDecision | None:
        """The decision for a publish of ``size`` bytes made at ``first_seen`` (wall
        time), asked at ``wall``; None when the agent has nothing to decide (no
        ``[network]`` kinds, or a class it does not know)."""
        name = qclass or ("urgent" if urgent else "normal")
        if not self.networks or name not in AGENT_CLASSES:
            return None
        report = DeviceReport(network=self.network, best=self.best, battery=self.battery)
        policy = network_policy(self.networks, AGENT_CLASSES, report=report)
        message = Outgoing(user="", qclass=name, size=size, first_seen=first_seen)
        decision = decide(
            policy,
            message,
            network=self.network,
            sms=False,
            usage=self._usage,
            now=wall,
            calendar=self.calendar,
        )
        return PublishDecision(name, self.network, decision)
