"""``[channels]`` of broker.toml: queue classes, the IP channel's tariff, limits.

Plain typed values that the config loader (``mdeci.config``) fills from TOML; the broker
turns them into a :class:`~mdeci.channels.selector.SelectorPolicy` per user
(:func:`classes_of`, :func:`limits_for`). docs/channels.md "Operator's guide" shows
every key with the thesis' example.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from mdeci.channels.errors import PolicyError
from mdeci.channels.limits import Limit, Period
from mdeci.channels.model import Billing, ClassPolicy, Kind, Tariff, Weights
from mdeci.channels.networks import THESIS_NETWORKS, Network

CHANNEL_NAMES = ("ip", "sms")


class Scope(enum.StrEnum):
    """Whose usage a limit counts."""

    USER = "user"  # each user's own (``user = "alice"``: that user only)
    GLOBAL = "global"  # everybody's together: the operator's whole budget


@dataclass(frozen=True, kw_only=True, slots=True)
class ClassConfig:
    """One ``[[channels.classes]]``: a queue class's weights, channels and Dmax."""

    name: str
    wc: float = 0.25  # weight of ln(cost)
    we: float = 0.25  # weight of ln(energy)
    wl: float = 0.25  # weight of ln(latency)
    wv: float = 0.25  # weight of ln(1/coverage)
    channels: tuple[str, ...] = ("ip",)  # "ip", "sms"
    both: bool = False  # while IP is up and SMS wins, send on both (dedup by nseq)
    max_delay: float = 0.0  # Dmax, seconds; > 0: may wait D = P * Dmax for a better one

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise PolicyError(f"class name {self.name!r}: letters, digits, '-' and '_' only")
        unknown = sorted(set(self.channels) - set(CHANNEL_NAMES))
        if unknown or not self.channels:
            raise PolicyError(f"class {self.name}: channels must be among {CHANNEL_NAMES}")
        self.policy()  # validates weights and max_delay

    def policy(self) -> ClassPolicy:
        return ClassPolicy(
            weights=Weights(cost=self.wc, energy=self.we, latency=self.wl, coverage=self.wv),
            kinds=frozenset(Kind(c) for c in self.channels),
            max_delay=self.max_delay,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class IpConfig:
    """``[channels.ip]``: the IP channel's tariff and starting figures.

    ``latency_ms`` and ``coverage`` are where the live moving averages start (RUDP RTT
    and delivery ratio per user replace them as soon as they are measured).
    """

    price: float = 30.0 / (6 * 1024 * 1024)  # the thesis' MNO plan: $30 for 6 GB, per KB
    billing: Billing = Billing.PRORATA
    unit_bytes: int = 1024
    energy_mw: float = 1500.0
    latency_ms: float = 250.0
    coverage: float = 1.0

    def tariff(self) -> Tariff:
        return Tariff(price=self.price, billing=self.billing, unit_bytes=self.unit_bytes)

    def __post_init__(self) -> None:
        self.tariff()
        if not (self.energy_mw > 0 and self.latency_ms > 0 and 0 < self.coverage <= 1):
            raise PolicyError("[channels.ip] energy_mw, latency_ms > 0 and 0 < coverage <= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class LimitConfig:
    """One ``[[channels.limits]]``: at most ``messages``/``bytes``/``money`` per period.

    ``channel`` (default "sms") and ``qclass`` (default: any) narrow what is counted;
    ``scope = "global"`` counts every user together; ``user`` makes it one user's.
    """

    period: Period
    scope: Scope = Scope.USER
    user: str | None = None
    channel: str | None = "sms"
    qclass: str | None = None
    messages: int | None = None
    bytes: int | None = None
    money: float | None = None

    def __post_init__(self) -> None:
        self.limit()
        if self.user is not None and self.scope is Scope.GLOBAL:
            raise PolicyError("a global limit cannot name a user")
        if self.channel is not None and self.channel not in CHANNEL_NAMES:
            raise PolicyError(f"limit channel must be among {CHANNEL_NAMES}")

    def limit(self) -> Limit:
        return Limit(
            period=self.period,
            channel=self.channel,
            qclass=self.qclass,
            messages=self.messages,
            bytes=self.bytes,
            money=self.money,
        )


def default_class_configs() -> tuple[ClassConfig, ...]:
    """urgent (IP or SMS, IP favoured unless it is unreliable), normal (IP), bulk (IP,
    cheapest, may wait an hour for a better channel)."""
    return (
        ClassConfig(name="urgent", wc=0.1, we=0.1, wl=0.2, wv=0.6, channels=("ip", "sms")),
        ClassConfig(name="normal"),
        ClassConfig(name="bulk", wc=1.0, we=0.0, wl=0.0, wv=0.0, max_delay=3600.0),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelsConfig:
    """``[channels]``: classes, the IP channel and limits (SMS figures are in ``[sms]``)."""

    default_class: str = "normal"  # of a subscription or publish that names none
    urgent_class: str = "urgent"  # of a publish with urgent = true
    classes: tuple[ClassConfig, ...] = field(default_factory=default_class_configs)
    ip: IpConfig = field(default_factory=IpConfig)
    limits: tuple[LimitConfig, ...] = ()
    # The access networks devices report (``[[channels.networks]]``): their price per MB
    # and figures, weighed when a delay-tolerant notification may wait for a cheaper one.
    networks: tuple[Network, ...] = THESIS_NETWORKS
    # Moving averages of the live figures: weight of a new sample (0 < alpha <= 1).
    alpha: float = 0.2

    def __post_init__(self) -> None:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise PolicyError(f"class names must be unique: {names}")
        for name in (self.default_class, self.urgent_class):
            if name not in names:
                raise PolicyError(f"class {name!r} is not among the classes {names}")
        for lim in self.limits:
            if lim.qclass is not None and lim.qclass not in names:
                raise PolicyError(f"limit names class {lim.qclass!r}, not among {names}")
        if not 0 < self.alpha <= 1:
            raise PolicyError("alpha must be in (0, 1]")
        kinds = [n.kind for n in self.networks]
        if len(set(kinds)) != len(kinds):
            raise PolicyError(f"network kinds must be unique: {kinds}")

    def classes_of(self) -> Mapping[str, ClassPolicy]:
        return {c.name: c.policy() for c in self.classes}

    def class_config(self, name: str) -> ClassConfig | None:
        for c in self.classes:
            if c.name == name:
                return c
        return None

    def limits_for(self, user: str, *, scope: Scope = Scope.USER) -> tuple[Limit, ...]:
        """The limits of ``scope`` that apply to ``user`` (its own and every user's)."""
        return tuple(
            lim.limit()
            for lim in self.limits
            if lim.scope is scope and lim.user in (None, user, _user_part(user))
        )


def _user_part(uri: str) -> str:
    """``alice`` of ``sip:alice@example.org`` (a limit names a user as in [[auth.users]])."""
    rest = uri.split(":", 1)[-1]
    return rest.split("@", 1)[0]
