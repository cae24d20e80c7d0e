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
   calendar's highest probability, over ``[first_seen, first_seen + Dmax)``, that at
   least one of them is there (a Wi-Fi the calendar expects in ten minutes counts for a
   bulk message that may wait an hour). The deadline depends only on ``first_seen``, so
   asking again gives the same deadline;
5. otherwise it goes on the best available channel, or nowhere (:class:`NoChannel`:
   the broker keeps it queued).

:class:`HoldQueue` keeps held messages and asks :func:`select` again when channels
change or a deadline passes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from math import log
from typing import Generic, TypeVar

from mdeci.channels.calendar import WeeklyCalendar
from mdeci.channels.cost import FLOOR, fixed_terms, score_with
from mdeci.channels.errors import PolicyError, UnknownQueueClass
from mdeci.channels.limits import CachedUsage, Limit, Usage, UsageCounter, period_of_day
from mdeci.channels.model import Billing, Channel, ClassPolicy, default_classes


@dataclass(frozen=True, kw_only=True, slots=True)
class SelectorPolicy:
    """A user's channels (in order of preference on ties), class policies and limits."""

    channels: tuple[Channel, ...]
    classes: Mapping[str, ClassPolicy] = field(default_factory=default_classes)
    limits: tuple[Limit, ...] = ()
    # Per class, computed on first use: the policy is immutable, so the allowed channels,
    # their size-independent score terms and their applicable limits never change.
    _plans: dict[str, tuple[ClassPolicy, tuple[_Candidate, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # Ranked channels per (user, class, size, UTC day), valid while the usage added for
    # the user since stays within their limits' slack (only with a CachedUsage; select).
    _ranked: dict[tuple[str, str, int, int], _Ranking] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # Questions asked once (a ranking is kept only for one asked again: with every size
    # new, building and keeping rankings is what the miss path would spend its time on).
    _asked: set[tuple[str, str, int, int]] = field(
        default_factory=set, init=False, repr=False, compare=False
    )
    # Per (user, class, UTC day): each candidate's room under its limits, whatever the
    # size (the size-independent half of step 2; see _Rooms).
    _rooms: dict[tuple[str, str, int], _Rooms] = field(
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
        found = self._plans.get(qclass)
        if found is not None:
            return found
        try:
            cls = self.classes[qclass]
        except KeyError:
            raise UnknownQueueClass(f"no policy for queue class {qclass!r}") from None
        plan = tuple(
            _candidate(order, channel, cls, tuple(
                lim for lim in self.limits if lim.applies(channel.name, qclass)
            ))
            for order, channel in enumerate(self.channels)
            if channel.kind in cls.kinds
        )  # fmt: skip
        self._plans[qclass] = found = (cls, plan)
        return found


@dataclass(frozen=True, slots=True)
class _Candidate:
    order: int
    channel: Channel
    fixed: tuple[float, ...]
    cost_weight: float
    limits: tuple[Limit, ...]
    # The channel's tariff, for Tariff.cost inlined (same arithmetic, same float).
    billing: int
    price: float
    unit_bytes: int
    overhead_bytes: int
    # A flat tariff's cost and score do not depend on the size: computed once (the same
    # float as score_with gives each time), so the miss path skips the logarithm.
    flat_cost: float | None = None
    flat_score: float = 0.0

    def cost(self, size: int) -> float:
        if self.billing == _FLAT:
            return self.price * 1.0
        size += self.overhead_bytes
        if self.billing == _PER_UNIT:
            return self.price * float(max(1, -(-size // self.unit_bytes)))
        return self.price * (size / self.unit_bytes)


def _candidate(
    order: int, channel: Channel, cls: ClassPolicy, limits: tuple[Limit, ...]
) -> _Candidate:
    tariff, fixed, cost_weight = channel.tariff, fixed_terms(channel, cls.weights), cls.weights.cost
    billing = _BILLING_CODE[tariff.billing]
    flat_cost = tariff.price * 1.0 if billing == _FLAT else None
    flat_score = score_with(fixed, cost_weight, flat_cost) if flat_cost is not None else 0.0
    return _Candidate(
        order, channel, fixed, cost_weight, limits, billing, tariff.price,
        tariff.unit_bytes, tariff.overhead_bytes, flat_cost, flat_score,
    )  # fmt: skip


_FLAT, _PER_UNIT, _PRORATA = 0, 1, 2
_BILLING_CODE = {Billing.FLAT: _FLAT, Billing.PER_UNIT: _PER_UNIT, Billing.PRORATA: _PRORATA}
#: Money closer than this to a limit's bound is decided by the exact (slow) test.
_MARGIN = 1e-9


@dataclass(frozen=True, slots=True)
class _Rooms:
    """Per candidate of one (user, class, day): how many more messages, bytes and money
    its limits allow (the minimum over them; money less a margin), read when ``usage``
    had added ``base`` for the user. Usage added since, counted against every room, can
    only make a room smaller by at most that much (counts only grow)."""

    usage: UsageCounter
    epoch: int
    base: Usage
    # Per plan entry: the candidate, its channel's name, its messages, bytes, money rooms.
    rooms: tuple[tuple[_Candidate, str, float, float, float], ...]


#: Rankings kept per policy before the memo is emptied (a few hundred bytes each).
MAX_RANKINGS = 4096


@dataclass(frozen=True, slots=True)
class _Ranking:
    """Steps 1-3 of select for one (user, class, size, day), with the decisions it can
    give already built (no allocation when it is reused)."""

    usage: UsageCounter
    epoch: int
    # What CachedUsage.added(user) was when this was computed, and how much more of each
    # may be added (to any counter) before some limit test here could come out otherwise.
    base: Usage
    slack_messages: float
    slack_bytes: float
    slack_money: float
    ranked: tuple[tuple[float, int, SendNow], ...]  # (score, order, decision), best first
    none: NoChannel  # what select answers when no ranked channel is available


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

    With a :class:`~mdeci.channels.limits.CachedUsage` (what the broker runs), steps 1-3
    (limits and ranking) are remembered per (user, class, size, UTC day) until that
    user's usage changes (:meth:`CachedUsage.generation`: a ``record_send``), so a
    repeated question costs a dictionary lookup; the answer is the same as without the
    memo, and equal decisions may be the same object.

    Raises :class:`UnknownQueueClass` if the policy has no class ``message.qclass``.
    """
    found = policy._plans.get(message.qclass)  # policy.plan, its hit inlined
    cls, plan = found if found is not None else policy.plan(message.qclass)
    user, size = message.user, message.size
    day = int(now // 86400)  # UTC day number: the periods' bounds are memoised by it
    if isinstance(usage, CachedUsage):
        key = (user, message.qclass, size, day)
        ranking = policy._ranked.get(key)
        added = usage.added(user)
        if (
            ranking is None
            or ranking.usage is not usage
            or ranking.epoch != usage.epoch
            or added.messages - ranking.base.messages > ranking.slack_messages
            or added.bytes - ranking.base.bytes > ranking.slack_bytes
            or added.money - ranking.base.money > ranking.slack_money
        ):
            if ranking is None and key not in policy._asked:
                # First time: answer from the rooms, keep nothing per size.
                asked = policy._asked
                if len(asked) >= MAX_RANKINGS:
                    asked.clear()
                asked.add(key)
                fast = _select_fresh(
                    policy, cls, plan, message, available, usage, added, day, now, calendar
                )
                if fast is not None:
                    return fast
            ranking = _rank(plan, usage, user, size, day, usage.epoch, added)
            memo = policy._ranked
            if len(memo) >= MAX_RANKINGS:
                memo.clear()
            memo[key] = ranking
    else:
        ranking = _rank(plan, usage, user, size, day, 0, Usage())
    ranked = ranking.ranked

    best: tuple[float, int, SendNow] | None = None
    for entry in ranked:
        if entry[2].channel.name in available:
            best = entry
            break
    if cls.max_delay > 0 and calendar is not None and best is not None:
        # Channels ranked better than the best available one (all of them come before
        # it, ties excepted), but absent now.
        better = tuple(
            r[2].channel.name
            for r in ranked
            if r[0] < best[0] and r[2].channel.name not in available
        )
        if better:
            held = _wait(calendar, better, message.first_seen, cls.max_delay, now)
            if held is not None:
                return held
    if best is None:
        return ranking.none
    return best[2]


def _rooms(
    plan: tuple[_Candidate, ...], usage: CachedUsage, user: str, day: int, base: Usage
) -> _Rooms:
    inf = float("inf")
    rooms: list[tuple[_Candidate, str, float, float, float]] = []
    for cand in plan:
        room_m = room_b = room_c = inf
        for limit in cand.limits:
            first, end = period_of_day(limit.period, day)
            used = usage.usage(user, first, end, channel=limit.channel, qclass=limit.qclass)
            if limit.messages is not None:
                room_m = min(room_m, limit.messages - used.messages)
            if limit.bytes is not None:
                room_b = min(room_b, limit.bytes - used.bytes)
            if limit.money is not None:
                room_c = min(room_c, limit.money - used.money)
        rooms.append((cand, cand.channel.name, room_m, room_b, room_c))
    return _Rooms(usage, usage.epoch, base, tuple(rooms))


def _store_rooms(policy: SelectorPolicy, key: tuple[str, str, int], rooms: _Rooms) -> _Rooms:
    if len(policy._rooms) >= MAX_RANKINGS:
        policy._rooms.clear()
    policy._rooms[key] = rooms
    return rooms


def _select_fresh(
    policy: SelectorPolicy,
    cls: ClassPolicy,
    plan: tuple[_Candidate, ...],
    message: Outgoing,
    available: Collection[str],
    usage: CachedUsage,
    added: Usage,
    day: int,
    now: float,
    calendar: WeeklyCalendar | None,
) -> Decision | None:
    """select for a size not asked before, from the per-(user, class, day) rooms: no
    ranking is built or kept. Returns None where only the full computation can answer
    exactly (a room too close to call, or no channel: NoChannel names the limits)."""
    user, size = message.user, message.size
    key = (user, message.qclass, day)
    rooms = policy._rooms.get(key)
    if rooms is None or rooms.usage is not usage or rooms.epoch != usage.epoch:
        rooms = _store_rooms(policy, key, _rooms(plan, usage, user, day, added))
    keep_all = cls.max_delay > 0 and calendar is not None  # Hold: absent ones' scores
    while True:
        base = rooms.base
        dm = added.messages - base.messages
        db = added.bytes - base.bytes
        dc = added.money - base.money
        best: tuple[float, int, _Candidate, float] | None = None
        scored: list[tuple[float, int, _Candidate, float]] | None = None
        unsure = False
        for cand, name, room_m, room_b, room_c in rooms.rooms:
            # Tariff.cost, inlined (same arithmetic, same float): this is the hot loop.
            flat = cand.flat_cost
            billing = cand.billing
            if flat is not None:
                cost = flat
            elif billing == _PER_UNIT:
                cost = cand.price * float(
                    max(1, -(-(size + cand.overhead_bytes) // cand.unit_bytes))
                )
            else:
                cost = cand.price * ((size + cand.overhead_bytes) / cand.unit_bytes)
            if room_m - dm < 1 or room_b - db < size or room_c - dc < cost + _MARGIN:
                if dm or db or dc or room_c - cost >= -_MARGIN:
                    unsure = True  # maybe within its limits after all
                    break
                continue  # over a limit, exactly
            if flat is not None:
                score = cand.flat_score
            else:
                score = 0.0
                if cand.cost_weight:
                    score += cand.cost_weight * log(cost if cost > FLOOR else FLOOR)
                for term in cand.fixed:
                    score += term
            if name in available:
                if best is None or score < best[0] or (score == best[0] and cand.order < best[1]):
                    best = (score, cand.order, cand, cost)
            elif keep_all:  # only absent channels can be waited for
                if scored is None:
                    scored = []
                scored.append((score, cand.order, cand, cost))
        if not unsure:
            break
        if not (dm or db or dc):
            return None  # too close to call from the rooms: ask exactly
        # Usage was added since the rooms were read: read them again, once.
        rooms = _store_rooms(policy, key, _rooms(plan, usage, user, day, added))
    if best is None:
        return None  # NoChannel: the full computation names what blocked each channel
    if scored:  # only with a calendar and Dmax > 0 (keep_all); only absent channels
        top = best[0]
        waits = [e for e in scored if e[0] < top]
        if len(waits) > 1:
            waits.sort(key=_fresh_key)
        better = tuple([e[2].channel.name for e in waits])
        if better and calendar is not None:
            held = _wait(calendar, better, message.first_seen, cls.max_delay, now)
            if held is not None:
                return held
    return SendNow(best[2].channel, best[0], best[3])


def _wait(
    calendar: WeeklyCalendar,
    better: tuple[str, ...],
    first_seen: float,
    max_delay: float,
    now: float,
) -> Hold | None:
    """Step 4: hold until ``first_seen + P * Dmax`` while that is ahead, ``P`` the
    calendar's highest chance of one of ``better`` within ``Dmax`` of ``first_seen``."""
    p = calendar.likeliest(better, first_seen, first_seen + max_delay)
    until = first_seen + p * max_delay
    if p > 0 and now < until:
        return Hold(until, better, p)
    return None


def _fresh_key(entry: tuple[float, int, _Candidate, float]) -> tuple[float, int]:
    return entry[0], entry[1]


def _rank(
    plan: tuple[_Candidate, ...],
    usage: UsageCounter,
    user: str,
    size: int,
    day: int,
    epoch: int,
    base: Usage,
) -> _Ranking:
    """Steps 2 and 3 of select: the channels within their limits, best first, and the
    slack of every limit test that passed (counts only grow within a period, so a test
    that failed keeps failing; one that passed keeps passing while the usage added
    since, counted against every limit whatever its scope, stays within its slack)."""
    ranked: list[tuple[float, int, SendNow]] = []
    blocked: list[tuple[str, str]] = []
    inf = float("inf")
    slack_m = slack_b = slack_c = inf
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
            if limit.messages is not None:
                slack_m = min(slack_m, limit.messages - used.messages - 1)
            if limit.bytes is not None:
                slack_b = min(slack_b, limit.bytes - used.bytes - size)
            if limit.money is not None:
                # Minus a margin: the sums are floats; nearer than that, compute again.
                slack_c = min(slack_c, limit.money - used.money - cost - 1e-9)
        if over is not None:
            blocked.append((channel.name, over.describe()))
            continue
        score = score_with(cand.fixed, cand.cost_weight, cost)
        ranked.append((score, cand.order, SendNow(channel, score, cost)))
    ranked.sort(key=_rank_key)
    reason = "no allowed channel is available" if ranked else "every channel is blocked"
    return _Ranking(
        usage,
        epoch,
        base,
        slack_m,
        slack_b,
        slack_c,
        tuple(ranked),
        NoChannel(reason, tuple(blocked)),
    )


def _rank_key(entry: tuple[float, int, SendNow]) -> tuple[float, int]:
    return entry[0], entry[1]


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
