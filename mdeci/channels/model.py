"""Channels, tariffs, weights and queue-class policies: frozen value objects, no I/O.

A channel is described by the four quantities of the thesis' utility function (McGill,
2010, "A message oriented middleware for mobility"): monetary cost ``C`` per message
(from a :class:`Tariff` and the message size), energy ``E`` (mW), latency ``L`` (ms) and
coverage ``V`` (a positive number; larger is better).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from mdeci.channels.errors import PolicyError


class Kind(enum.Enum):
    """What kind of bearer a channel is; SMS is used only by classes that allow it."""

    IP = "ip"
    SMS = "sms"


class Billing(enum.Enum):
    """How a :class:`Tariff` turns a message size into billed units."""

    FLAT = "flat"  # one unit per message, whatever its size
    PER_UNIT = "per_unit"  # ceil(size / unit_bytes) units (e.g. whole KB, or SMS segments)
    PRORATA = "prorata"  # size / unit_bytes units (exact fraction)


@dataclass(frozen=True, kw_only=True, slots=True)
class Tariff:
    """Price of ``price`` (money, e.g. $) per billed unit.

    ``unit_bytes`` is the size of a unit for PER_UNIT and PRORATA billing (1024 for a
    per-KB data plan, the segment payload for SMS), and ``overhead_bytes`` is added to
    the message size first (the SMS layer's integrity tag). A free channel has
    ``price = 0``. ``mdeci.sms.sms_tariff`` builds the exact tariff of an SMS channel.
    """

    price: float = 0.0
    billing: Billing = Billing.FLAT
    unit_bytes: int = 1024
    overhead_bytes: int = 0

    def __post_init__(self) -> None:
        if not (self.price >= 0 and math.isfinite(self.price)):
            raise PolicyError(f"tariff price must be finite and >= 0, not {self.price!r}")
        if self.unit_bytes < 1 or self.overhead_bytes < 0:
            raise PolicyError("tariff unit_bytes must be >= 1 and overhead_bytes >= 0")

    def units(self, size: int) -> float:
        """Billed units for a message of ``size`` bytes (at least one for a non-empty one)."""
        if self.billing is Billing.FLAT:
            return 1.0
        size += self.overhead_bytes
        if self.billing is Billing.PER_UNIT:
            return float(max(1, -(-size // self.unit_bytes)))
        return size / self.unit_bytes

    def cost(self, size: int) -> float:
        """Money charged for a message of ``size`` bytes."""
        return self.price * self.units(size)


@dataclass(frozen=True, kw_only=True, slots=True)
class Channel:
    """One way to reach a user: its tariff and its energy, latency and coverage figures."""

    name: str
    kind: Kind = Kind.IP
    tariff: Tariff = field(default_factory=Tariff)
    energy_mw: float = 1.0
    latency_ms: float = 1.0
    coverage: float = 1.0

    def __post_init__(self) -> None:
        if not self.name:
            raise PolicyError("a channel needs a name")
        for what, value in (
            ("energy_mw", self.energy_mw),
            ("latency_ms", self.latency_ms),
            ("coverage", self.coverage),
        ):
            if not (value >= 0 and math.isfinite(value)):
                raise PolicyError(f"channel {self.name}: {what} must be finite and >= 0")
        if self.coverage == 0:
            raise PolicyError(f"channel {self.name}: coverage must be > 0 (ln(1/V))")

    def cost(self, size: int) -> float:
        """Money a message of ``size`` bytes costs on this channel."""
        return self.tariff.cost(size)


@dataclass(frozen=True, kw_only=True, slots=True)
class Weights:
    """Weights of cost, energy, latency and coverage; non-negative, summing to 1."""

    cost: float = 0.25
    energy: float = 0.25
    latency: float = 0.25
    coverage: float = 0.25

    def __post_init__(self) -> None:
        values = (self.cost, self.energy, self.latency, self.coverage)
        if any(not (w >= 0 and math.isfinite(w)) for w in values):
            raise PolicyError(f"weights must be finite and >= 0, not {values}")
        if abs(sum(values) - 1.0) > 1e-9:
            raise PolicyError(f"weights must sum to 1, not {sum(values)}")


#: Weights that pick the cheapest channel and nothing else.
CHEAPEST = Weights(cost=1.0, energy=0.0, latency=0.0, coverage=0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClassPolicy:
    """How one queue class (urgent, normal, bulk ...) chooses.

    ``kinds`` are the channel kinds the class may use: by default only urgent
    notifications may go by SMS (docs/protocol.md §7). ``max_delay`` (seconds, the thesis'
    ``Dmax``) is how long a notification may wait for a better channel; 0 never holds.
    """

    weights: Weights = field(default_factory=Weights)
    kinds: frozenset[Kind] = frozenset({Kind.IP})
    max_delay: float = 0.0

    def __post_init__(self) -> None:
        if not (self.max_delay >= 0 and math.isfinite(self.max_delay)):
            raise PolicyError("max_delay must be finite and >= 0")
        if not self.kinds:
            raise PolicyError("a class must allow at least one channel kind")


def default_classes() -> dict[str, ClassPolicy]:
    """urgent (IP or SMS) and normal (IP) with equal weights; bulk (IP) by cost alone,
    waiting up to an hour. The broker builds its classes from ``[channels]`` instead."""
    return {
        "urgent": ClassPolicy(kinds=frozenset({Kind.IP, Kind.SMS})),
        "normal": ClassPolicy(),
        "bulk": ClassPolicy(weights=CHEAPEST, max_delay=3600.0),
    }
