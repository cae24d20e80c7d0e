"""Access networks as channels: deliver now, wait for a cheaper network, or SMS.

The thesis (McGill, 2010, "A message oriented middleware for mobility") weighs each
access network of the mobile host (Wi-Fi, the operator's data network, SMS) with its own
cost, energy, latency and coverage, and lets a delay-tolerant message wait for a cheaper
network when the device's calendar says one is coming. The same decision runs at both
ends: in the broker for each queued notification, in the agent for each publish.

Theory of operation. A :class:`Network` is one access-network kind (``wifi``,
``cellular``, ...) with its price per MB; it becomes a :class:`~mdeci.channels.model.Channel`
named by its kind. The device reports which kind carries its traffic now, its best
observed latency and coverage per kind (the broker cannot measure a network the device
is not on) and its battery (:class:`DeviceReport`). :func:`network_policy` builds the
:class:`~mdeci.channels.selector.SelectorPolicy` from them; :func:`decide` asks
:func:`~mdeci.channels.selector.select` with the current network (and SMS, when the
caller has it) as the available channels, and answers:

- :class:`Deliver`: send on the current network now;
- :class:`Wait`: hold until ``until`` for one of ``waiting_for``; ``until`` is at most
  ``first_seen + Dmax`` (the class's ``max_delay``), so a class with ``max_delay = 0``
  (urgent) never waits;
- :class:`BySms`: send by SMS;
- :class:`Queue`: nothing can carry it now (no network and SMS not allowed or blocked).

A held message is decided again (:func:`decide`, the same ``first_seen``) when the device
reports another network and at ``until``: on a network it waited for it is delivered at
once; at ``until`` it goes on the best channel there (:func:`released`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from mdeci.channels.calendar import WeeklyCalendar
from mdeci.channels.errors import PolicyError
from mdeci.channels.limits import Limit, UsageCounter
from mdeci.channels.model import Billing, Channel, ClassPolicy, Kind, Tariff, Weights
from mdeci.channels.selector import Hold, NoChannel, Outgoing, SelectorPolicy, SendNow, select

#: Bytes in the MB of ``price_per_mb`` (binary: the thesis' plan is 30 $ per 6 GB).
MB = 1024 * 1024

#: The channel name SMS has in a network policy.
SMS = "sms"


@dataclass(frozen=True, kw_only=True, slots=True)
class Network:
    """One access-network kind and its figures: ``price_per_mb`` (money per MB, billed
    pro rata), ``energy_mw``, ``latency_ms`` and ``coverage`` (0 < V <= 1)."""

    kind: str
    price_per_mb: float = 0.0
    energy_mw: float = 1000.0
    latency_ms: float = 100.0
    coverage: float = 1.0

    def __post_init__(self) -> None:
        if not self.kind or not self.kind.replace("-", "").replace("_", "").isalnum():
            raise PolicyError(f"network kind {self.kind!r}: letters, digits, '-' and '_' only")
        if self.kind == SMS:
            raise PolicyError("'sms' is not a network kind (it is its own channel)")
        if not (self.price_per_mb >= 0 and math.isfinite(self.price_per_mb)):
            raise PolicyError(f"network {self.kind}: price_per_mb must be finite and >= 0")
        for what, value in (("energy_mw", self.energy_mw), ("latency_ms", self.latency_ms)):
            if not (value > 0 and math.isfinite(value)):
                raise PolicyError(f"network {self.kind}: {what} must be finite and > 0")
        if not 0 < self.coverage <= 1:
            raise PolicyError(f"network {self.kind}: coverage must be in (0, 1]")

    def channel(self, best: Best | None = None) -> Channel:
        """This network as a channel; ``best`` (the device's best observed figures)
        replaces the configured latency and coverage."""
        return Channel(
            name=self.kind,
            kind=Kind.IP,
            tariff=Tariff(price=self.price_per_mb, billing=Billing.PRORATA, unit_bytes=MB),
            energy_mw=self.energy_mw,
            latency_ms=best.latency_ms if best is not None else self.latency_ms,
            coverage=best.coverage if best is not None else self.coverage,
        )


#: The thesis' figures: MNO data at 30 $ for 6 GB, 1,500 mW, 250 ms; Wi-Fi free.
THESIS_NETWORKS = (
    Network(kind="wifi", price_per_mb=0.0, energy_mw=1000.0, latency_ms=50.0),
    Network(kind="cellular", price_per_mb=30.0 / (6 * 1024), energy_mw=1500.0, latency_ms=250.0),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Best:
    """The best latency (ms) and coverage (0 < V <= 1) the device observed on a network."""

    latency_ms: float
    coverage: float = 1.0

    def __post_init__(self) -> None:
        if not (self.latency_ms > 0 and math.isfinite(self.latency_ms)):
            raise PolicyError("best latency_ms must be finite and > 0")
        if not 0 < self.coverage <= 1:
            raise PolicyError("best coverage must be in (0, 1]")


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceReport:
    """What the device tells: the network kind carrying its traffic now (``None``: no
    IP), its best observed figures per kind, and its battery (0..1; ``None``: unknown,
    taken as full)."""

    network: str | None = None
    best: Mapping[str, Best] = field(default_factory=dict)
    battery: float | None = None

    def __post_init__(self) -> None:
        if self.battery is not None and not 0 <= self.battery <= 1:
            raise PolicyError(f"battery must be in [0, 1], not {self.battery!r}")


#: Below this battery level the energy weight of every class is raised (see
#: :func:`battery_weights`).
LOW_BATTERY = 0.2


def battery_weights(weights: Weights, battery: float | None, low: float = LOW_BATTERY) -> Weights:
    """The weights a class uses at ``battery``: unchanged at or above ``low``; below it
    the energy weight rises linearly to 0.5 at an empty battery, the other weights
    scaled down to keep the sum 1. A factor on E alone would not do: it is the same for
    every channel, so it cancels out of the comparison."""
    if battery is None or battery >= low or low <= 0:
        return weights
    target = max(weights.energy, 0.5 * (1 - battery / low) + weights.energy * battery / low)
    rest = weights.cost + weights.latency + weights.coverage
    if rest <= 0:
        return weights
    scale = (1 - target) / rest
    return Weights(
        cost=weights.cost * scale,
        energy=1 - (weights.cost + weights.latency + weights.coverage) * scale,
        latency=weights.latency * scale,
        coverage=weights.coverage * scale,
    )


def network_policy(
    networks: Sequence[Network],
    classes: Mapping[str, ClassPolicy],
    *,
    report: DeviceReport | None = None,
    sms: Channel | None = None,
    limits: tuple[Limit, ...] = (),
) -> SelectorPolicy:
    """The selector policy of a device: one channel per network kind (the device's best
    observed figures where it gave them), then SMS if ``sms`` is given (a caller without
    SMS leaves it out: then it is simply not a channel). A network the device reports
    that is not configured is added as a free one (nothing is known to weigh it)."""
    best = report.best if report is not None else {}
    channels = [net.channel(best.get(net.kind)) for net in networks]
    known = {net.kind for net in networks}
    if report is not None and report.network is not None and report.network not in known:
        channels.append(Network(kind=report.network).channel(best.get(report.network)))
    if sms is not None:
        if sms.kind is not Kind.SMS or sms.name != SMS:
            raise PolicyError("the SMS channel must be named 'sms' and of kind sms")
        channels.append(sms)
    battery = report.battery if report is not None else None
    if battery is not None and battery < LOW_BATTERY:
        classes = {
            name: replace(cls, weights=battery_weights(cls.weights, battery))
            for name, cls in classes.items()
        }
    return SelectorPolicy(channels=tuple(channels), classes=dict(classes), limits=limits)


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send on ``network``, the one the device is on now."""

    network: str
    score: float
    cost: float


@dataclass(frozen=True, slots=True)
class Wait:
    """Hold until ``until`` (at most ``deadline = first_seen + Dmax``) for one of
    ``waiting_for``, which the calendar expects with probability ``p``."""

    until: float
    deadline: float
    waiting_for: tuple[str, ...]
    p: float


@dataclass(frozen=True, slots=True)
class BySms:
    """Send by SMS."""

    score: float
    cost: float


@dataclass(frozen=True, slots=True)
class Queue:
    """No channel can carry it now; keep it queued (``blocked``: limits that excluded a
    channel, as (channel, limit))."""

    reason: str
    blocked: tuple[tuple[str, str], ...] = ()


NetworkDecision = Deliver | Wait | BySms | Queue


def available_now(network: str | None, *, sms: bool) -> frozenset[str]:
    """The channels available while the device is on ``network`` (None: none), with SMS
    when the caller can send one."""
    names = {network} if network is not None else set()
    if sms:
        names.add(SMS)
    return frozenset(names)


def decide(
    policy: SelectorPolicy,
    message: Outgoing,
    *,
    network: str | None,
    sms: bool,
    usage: UsageCounter,
    now: float,
    calendar: WeeklyCalendar | None = None,
) -> NetworkDecision:
    """Decide for ``message`` while the device is on ``network`` (see the module
    docstring). ``sms``: SMS may be used now (configured, the user has a number, the
    gateway runs); a policy without an ``sms`` channel never answers :class:`BySms`.

    Raises :class:`~mdeci.channels.errors.UnknownQueueClass` for a class without a policy.
    """
    available = available_now(network, sms=sms)
    decision = select(policy, message, available=available, usage=usage, now=now, calendar=calendar)
    return as_network_decision(policy, message, decision)


def as_network_decision(
    policy: SelectorPolicy, message: Outgoing, decision: SendNow | Hold | NoChannel
) -> NetworkDecision:
    """:func:`decide`'s answer for a :func:`select` decision."""
    if isinstance(decision, SendNow):
        if decision.channel.kind is Kind.SMS:
            return BySms(decision.score, decision.cost)
        return Deliver(decision.channel.name, decision.score, decision.cost)
    if isinstance(decision, Hold):
        cls = policy.plan(message.qclass)[0]
        return Wait(
            decision.until, message.first_seen + cls.max_delay, decision.waiting_for, decision.p
        )
    return Queue(decision.reason, decision.blocked)


def released(wait: Wait, network: str | None, now: float) -> bool:
    """Whether a message held as ``wait`` must be decided again now: the device is on a
    network it waited for, or its time ran out."""
    return now >= wait.until or (network is not None and network in wait.waiting_for)


def describe(decision: NetworkDecision, *, network: str | None, qclass: str) -> str:
    """The inputs and the answer of a decision as ``key=value`` words (the churn log's
    ``reason``, docs/protocol.md §8)."""
    words = [f"network={network or 'none'}", f"class={qclass}"]
    if isinstance(decision, Deliver):
        words.append("decision=deliver")
    elif isinstance(decision, BySms):
        words.append("decision=sms")
    elif isinstance(decision, Wait):
        words += [
            "decision=wait",
            f"for={'/'.join(decision.waiting_for)}",
            f"until={decision.until:.3f}",
            f"p={decision.p:.4g}",
            f"deadline={decision.deadline:.3f}",
        ]
    else:
        words += ["decision=queue", f"why={decision.reason.replace(' ', '_')}"]
    return " ".join(words)
