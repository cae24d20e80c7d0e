"""A per-user weekly calendar of channel probabilities (the thesis' ``P``).

For each channel, the probability that it is available during each slot of a week
(default: hourly slots, 168 of them, slot 0 being Monday 00:00 in the user's local time,
``utc_offset_minutes`` east of UTC). A delay-tolerant notification may wait
``D = P * Dmax`` for a better channel, ``P`` read from this calendar.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mdeci.channels.errors import PolicyError

WEEK_MINUTES = 7 * 24 * 60


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """``channel`` is available with probability ``p`` on ``weekdays`` (0 = Monday) from
    ``start_hour`` (inclusive) to ``end_hour`` (exclusive), local time."""

    channel: str
    p: float
    weekdays: frozenset[int] = frozenset(range(7))
    start_hour: int = 0
    end_hour: int = 24


@dataclass(frozen=True, kw_only=True, slots=True)
class WeeklyCalendar:
    """Probabilities per channel and slot; a channel absent from the calendar has P = 0."""

    slots: Mapping[str, Sequence[float]] = field(default_factory=dict)
    slot_minutes: int = 60
    utc_offset_minutes: int = 0
    # any_of answers per (channels, slot): the calendar is immutable, and a user's
    # messages ask the same question for a whole slot (an hour by default).
    _any: dict[tuple[tuple[str, ...], int], float] = field(
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

    @classmethod
    def constant(cls, probabilities: Mapping[str, float]) -> WeeklyCalendar:
        """The same probability for every slot of the week."""
        return cls.from_rules(Rule(channel=ch, p=p) for ch, p in probabilities.items())

    @classmethod
    def from_rules(cls, rules: Iterable[Rule], *, utc_offset_minutes: int = 0) -> WeeklyCalendar:
        """Hourly calendar from rules; a later rule overrides an earlier one for its hours."""
        slots: dict[str, list[float]] = {}
        for rule in rules:
            if not 0 <= rule.start_hour <= rule.end_hour <= 24:
                raise PolicyError("rule hours must satisfy 0 <= start <= end <= 24")
            probs = slots.setdefault(rule.channel, [0.0] * (WEEK_MINUTES // 60))
            for day in rule.weekdays:
                for hour in range(rule.start_hour, rule.end_hour):
                    probs[day * 24 + hour] = rule.p
        return cls(
            slots={k: tuple(v) for k, v in slots.items()}, utc_offset_minutes=utc_offset_minutes
        )

    def probability(self, channel: str, at: float) -> float:
        """Probability that ``channel`` is available at Unix time ``at``."""
        probs = self.slots.get(channel)
        if probs is None:
            return 0.0
        return probs[self.slot_of(at)]

    def slot_of(self, at: float) -> int:
        """Index of the slot containing Unix time ``at``."""
        # Minute of the local week by arithmetic (no datetime: this is the selector's hot
        # path); 1970-01-01 was a Thursday, day 3 of a week starting on Monday.
        minute = int((at // 60 + self.utc_offset_minutes + 3 * 24 * 60) % WEEK_MINUTES)
        return minute // self.slot_minutes

    def any_of(self, channels: Iterable[str], at: float) -> float:
        """Probability that at least one of ``channels`` is available (taken as independent)."""
        names = tuple(channels)
        slot = self.slot_of(at)
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
