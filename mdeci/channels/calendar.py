"""A per-user weekly calendar of channel probabilities (the thesis' ``P``).

For each channel, the probability that it is available during each slot of a week
(default: hourly slots, 168 of them, slot 0 being Monday 00:00 in the user's local time,
``utc_offset_minutes`` east of UTC), and dated rules over it: one-off spans of Unix time
("Wi-Fi from 10:40 today", "in ten minutes the device reaches its destination"). A
delay-tolerant notification may wait ``D = P * Dmax`` for a better channel, ``P`` the
calendar's highest probability over ``[first_seen, first_seen + Dmax)`` that one of them
is there (:meth:`WeeklyCalendar.likeliest`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mdeci.channels.errors import PolicyError

WEEK_MINUTES = 7 * 24 * 60
#: Minutes from the Unix epoch (a Thursday) back to the Monday that starts its week.
MONDAY_MINUTES = 3 * 24 * 60


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """``channel`` is available with probability ``p`` on ``weekdays`` (0 = Monday) from
    ``start_hour`` (inclusive) to ``end_hour`` (exclusive), local time; or, for a dated
    rule (``start_at`` and ``end_at`` set, Unix seconds), from ``start_at`` (inclusive)
    to ``end_at`` (exclusive) only, whatever its weekdays and hours."""

    channel: str
    p: float
    weekdays: frozenset[int] = frozenset(range(7))
    start_hour: int = 0
    end_hour: int = 24
    start_at: float | None = None
    end_at: float | None = None

    def __post_init__(self) -> None:
        if (self.start_at is None) != (self.end_at is None):
            raise PolicyError("a dated rule needs both start_at and end_at")
        if self.start_at is not None and self.end_at is not None:
            if not (math.isfinite(self.start_at) and math.isfinite(self.end_at)):
                raise PolicyError("start_at and end_at must be finite")
            if not self.start_at < self.end_at:
                raise PolicyError("a dated rule must end after it starts")


@dataclass(frozen=True, slots=True)
class Span:
    """A dated rule as the calendar reads it: ``channel`` with probability ``p`` in
    ``[start, end)`` (Unix seconds)."""

    channel: str
    p: float
    start: float
    end: float


@dataclass(frozen=True, kw_only=True, slots=True)
class WeeklyCalendar:
    """Probabilities per channel and slot; a channel absent from the calendar has P = 0."""

    slots: Mapping[str, Sequence[float]] = field(default_factory=dict)
    slot_minutes: int = 60
    utc_offset_minutes: int = 0
    # One-off spans over the weekly slots; a later one overrides an earlier one.
    dated: tuple[Span, ...] = ()
    # any_of answers per (channels, slot): the calendar is immutable, and a user's
    # messages ask the same question for a whole slot (an hour by default).
    _any: dict[tuple[tuple[str, ...], int], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # likeliest's answers per (channels, first slot, slots touched), without dated rules.
    _within: dict[tuple[tuple[str, ...], int, int], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.slot_minutes < 1 or WEEK_MINUTES % self.slot_minutes:
            raise PolicyError("slot_minutes must divide a week")
        count = WEEK_MINUTES // self.slot_minutes
        for channel, probs in self.slots.items():
            if len(probs) != count:
                raise PolicyError(f"calendar for {channel}: {len(probs)} slots, need {count}")
            if any(not (0.0 <= p <= 1.0) or math.isnan(p) for p in probs):
                raise PolicyError(f"calendar for {channel}: probabilities must be in [0, 1]")
        for span in self.dated:
            if not (0.0 <= span.p <= 1.0 and span.start < span.end):
                raise PolicyError("dated spans need p in [0, 1] and start < end")

    @classmethod
    def constant(cls, probabilities: Mapping[str, float]) -> WeeklyCalendar:
        """The same probability for every slot of the week."""
        return cls.from_rules(Rule(channel=ch, p=p) for ch, p in probabilities.items())

    @classmethod
    def from_rules(cls, rules: Iterable[Rule], *, utc_offset_minutes: int = 0) -> WeeklyCalendar:
        """Hourly calendar from rules; a later rule overrides an earlier one for its hours
        (dated rules override the weekly ones, and a later dated one an earlier one)."""
        slots: dict[str, list[float]] = {}
        dated: list[Span] = []
        for rule in rules:
            if rule.start_at is not None and rule.end_at is not None:
                dated.append(Span(rule.channel, rule.p, rule.start_at, rule.end_at))
                continue
            if not 0 <= rule.start_hour <= rule.end_hour <= 24:
                raise PolicyError("rule hours must satisfy 0 <= start <= end <= 24")
            probs = slots.setdefault(rule.channel, [0.0] * (WEEK_MINUTES // 60))
            for day in rule.weekdays:
                for hour in range(rule.start_hour, rule.end_hour):
                    probs[day * 24 + hour] = rule.p
        return cls(
            slots={k: tuple(v) for k, v in slots.items()},
            utc_offset_minutes=utc_offset_minutes,
            dated=tuple(dated),
        )

    def probability(self, channel: str, at: float) -> float:
        """Probability that ``channel`` is available at Unix time ``at``."""
        for span in reversed(self.dated):
            if span.channel == channel and span.start <= at < span.end:
                return span.p
        probs = self.slots.get(channel)
        if probs is None:
            return 0.0
        return probs[self.slot_of(at)]

    def slot_of(self, at: float) -> int:
        """Index of the slot containing Unix time ``at``."""
        # Minute of the local week by arithmetic (no datetime: this is the selector's hot
        # path); 1970-01-01 was a Thursday, day 3 of a week starting on Monday.
        minute = int((at // 60 + self.utc_offset_minutes + MONDAY_MINUTES) % WEEK_MINUTES)
        return minute // self.slot_minutes

    def any_of(self, channels: Iterable[str], at: float) -> float:
        """Probability that at least one of ``channels`` is available (taken as independent)."""
        names = tuple(channels)
        if self.dated and any(d.start <= at < d.end for d in self.dated):
            none = 1.0
            for channel in names:
                none *= 1.0 - self.probability(channel, at)
            return 1.0 - none
        return self._any_in_slot(names, self.slot_of(at))

    def _any_in_slot(self, names: tuple[str, ...], slot: int) -> float:
        key = (names, slot)
        found = self._any.get(key)
        if found is None:
            none = 1.0
            for channel in names:
                probs = self.slots.get(channel)
                if probs is not None:
                    none *= 1.0 - probs[slot]
            found = 1.0 - none
            if len(self._any) >= 4096:
                self._any.clear()
            self._any[key] = found
        return found

    def likeliest(self, channels: Iterable[str], start: float, end: float) -> float:
        """The highest probability, at any time in ``[start, end)``, that at least one of
        ``channels`` is available: what a message may wait for until ``end``."""
        names = tuple(channels)
        length = self.slot_minutes * 60
        # Seconds from the start of ``start``'s slot (slots begin on whole local minutes).
        into = (start + (self.utc_offset_minutes + MONDAY_MINUTES) * 60) % length
        count = WEEK_MINUTES // self.slot_minutes
        touched = min(count, max(1, math.ceil((end - start + into) / length)))
        if self.dated and any(d.start < end and start < d.end for d in self.dated):
            # Probabilities change only at slot boundaries and at dated rules' ends: those
            # instants inside the window are the only ones to read.
            edges = [start + k * length - into for k in range(1, touched)]
            edges += [at for d in self.dated for at in (d.start, d.end) if start < at < end]
            return max(self.any_of(names, at) for at in (start, *edges))
        slot = self.slot_of(start)
        key = (names, slot, touched)
        found = self._within.get(key)
        if found is None:
            found = max(self._any_in_slot(names, (slot + k) % count) for k in range(touched))
            if len(self._within) >= 4096:
                self._within.clear()
            self._within[key] = found
        return found
