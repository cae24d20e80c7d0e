"""The channel selector: per notification, which channel, now or later.

Theory of operation. :func:`select` is a pure function of the policy, the message, the
set of channels available now, the usage counters and the clock:

1. the message's queue class gives the weights, the channel kinds it may use and its
   ``Dmax`` (:class:`~mdeci.channels.model.ClassPolicy`);
2. a channel over any of its limits (per channel, per class, global; per day, week and
   month; messages, bytes, money) is skipped;
3. the remaining channels are ranked by the utility ``f`` (lowest first,
   :func:`~mdeci.channels.cost.score`); ties keep the policy's channel order;
4. if the class tolerates delay and channels better than the best available one are
   absent now, the message may wait until ``first_seen + P * Dmax``, where ``P`` is the
   calendar's probability, at ``first_seen``, that at least one of them appears. The
   deadline depends only on ``first_seen``, so asking again gives the same deadline;
5. otherwise it goes on the best available channel, or nowhere (:class:`NoChannel`:
   the broker keeps it queued).

:class:`HoldQueue` keeps held messages and asks :func:`select` again when channels
change or a deadline passes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mdeci.channels.calendar import WeeklyCalendar
from mdeci.channels.cost import fixed_terms, score_with
from mdeci.channels.errors import PolicyError, UnknownQueueClass
from mdeci.channels.limits import Limit, Usage, UsageCounter, period_of_day
from mdeci.channels.model import Channel, ClassPolicy, default_classes


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectorPolicy:
    """A user's channels (in order of preference on ties), class policies and limits."""

    channels: tuple[Channel, ...]
    classes: Mapping[str, ClassPolicy] = field(default_factory=default_classes)
    limits: tuple[Limit, ...] = ()
    # Per class, computed on first use: the policy is immutable, so the allowed channels,
    # their size-independent score terms and their applicable limits never change.
    _plans: dict[str, tuple[_Candidate, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise PolicyError(f"channel names must be unique: {names}")

    def plan(self, qclass: str) -> tuple[ClassPolicy, tuple[_Candidate, ...]]:
        """The class policy and its candidate channels, in policy order.

        Raises :class:`UnknownQueueClass` for a class without a policy.
        """
        try:
            cls = self.classes[qclass]
        except KeyError:
            raise UnknownQueueClass(f"no policy for queue class {qclass!r}") from None
        plan = self._plans.get(qclass)
        if plan is None:
            plan = tuple(
                _Candidate(
                    order,
                    channel,
                    fixed_terms(channel, cls.weights),
                    cls.weights.cost,
                    tuple(lim for lim in self.limits if lim.applies(channel.name, qclass)),
                )
                for order, channel in enumerate(self.channels)
                if channel.kind in cls.kinds
            )
            self._plans[qclass] = plan
        return cls, plan


@dataclass(frozen=True, slots=True)
class _Candidate:
    order: int
    channel: Channel
    fixed: tuple[float, ...]
    cost_weight: float
    limits: tuple[Limit, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Outgoing:
    """A notification to place: for ``user``, of class ``qclass``, ``size`` bytes,
    queued at ``first_seen`` (Unix time)."""

    user: str
    qclass: str
    size: int
    first_seen: float


@dataclass(frozen=True, slots=True)
class SendNow:
    """Send on ``channel`` now; it will cost ``cost``; ``score`` is its utility."""

    channel: Channel
    score: float
    cost: float


@dataclass(frozen=True, slots=True)
class Hold:
    """Wait until ``until`` for one of ``waiting_for`` (probability ``p`` it appears)."""

    until: float
    waiting_for: tuple[str, ...]
    p: float


@dataclass(frozen=True, slots=True)
class NoChannel:
    """No allowed channel is available and within its limits; keep the message queued.

    ``blocked`` maps a channel to the limit that excluded it.
    """

    reason: str
    blocked: tuple[tuple[str, str], ...] = ()


Decision = SendNow | Hold | NoChannel


def select(
    policy: SelectorPolicy,
    message: Outgoing,
    *,
    available: Collection[str],
    usage: UsageCounter,
    now: float,
    calendar: WeeklyCalendar | None = None,
) -> Decision:
    """Choose a channel for ``message`` (see the module docstring).

    Raises :class:`UnknownQueueClass` if the policy has no class ``message.qclass``.
    """
    cls, plan = policy.plan(message.qclass)
    ranked: list[tuple[float, int, Channel, float]] = []
    blocked: list[tuple[str, str]] = []
    user, size = message.user, message.size
    day = int(now // 86400)  # UTC day number: the periods' bounds are memoised by it
    for cand in plan:
        channel = cand.channel
        cost = channel.cost(size)
        over: Limit | None = None
        # The same test as limits.first_exceeded, inlined: this loop is the hot path.
        for limit in cand.limits:
            first, end = period_of_day(limit.period, day)
            used = usage.usage(user, first, end, channel=limit.channel, qclass=limit.qclass)
            if not limit.allows_more(used, 1, size, cost):
                over = limit
                break
        if over is not None:
            blocked.append((channel.name, over.describe()))
            continue
        ranked.append((score_with(cand.fixed, cand.cost_weight, cost), cand.order, channel, cost))
    ranked.sort()

    best = next((r for r in ranked if r[2].name in available), None)
    if cls.max_delay > 0 and calendar is not None:
        better = tuple(r[2].name for r in ranked if best is None or r[0] < best[0])
        better = tuple(name for name in better if name not in available)
        if best is not None and better:
            p = calendar.any_of(better, message.first_seen)
            until = message.first_seen + p * cls.max_delay
            if p > 0 and now < until:
                return Hold(until, better, p)
    if best is None:
        reason = "no allowed channel is available" if ranked else "every channel is blocked"
        return NoChannel(reason, tuple(blocked))
    return SendNow(best[2], best[0], best[3])


def record_send(usage: UsageCounter, message: Outgoing, decision: SendNow, *, at: float) -> Usage:
    """Count a message sent as ``decision`` said; returns what was counted."""
    used = Usage(1, message.size, decision.cost)
    usage.add(message.user, decision.channel.name, message.qclass, at, used)
    return used


K = TypeVar("K")


class HoldQueue(Generic[K]):
    """Messages held for a better channel, keyed by the caller's id (e.g. ``nseq``).

    Call :meth:`reconsider` when the available channels change and when
    :meth:`next_deadline` passes; it returns the messages that no longer wait.
    """

    def __init__(self) -> None:
        self._held: dict[K, tuple[Outgoing, float]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, key: object) -> bool:
        return key in self._held

    def hold(self, key: K, message: Outgoing, decision: Hold) -> None:
        self._held[key] = (message, decision.until)

    def discard(self, key: K) -> None:
        self._held.pop(key, None)

    def next_deadline(self) -> float | None:
        return min((until for _, until in self._held.values()), default=None)

    def reconsider(
        self,
        policy: SelectorPolicy,
        *,
        available: Collection[str],
        usage: UsageCounter,
        now: float,
        calendar: WeeklyCalendar | None = None,
    ) -> list[tuple[K, Outgoing, SendNow | NoChannel]]:
        """Select again for every held message; those not held any more leave the queue."""
        released: list[tuple[K, Outgoing, SendNow | NoChannel]] = []
        for key, (message, _) in list(self._held.items()):
            decision = select(
                policy, message, available=available, usage=usage, now=now, calendar=calendar
            )
            if isinstance(decision, Hold):
                self._held[key] = (message, decision.until)
                continue
            del self._held[key]
            released.append((key, message, decision))
        return released
