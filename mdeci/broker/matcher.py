"""The in-memory cache of compiled subscriptions that every ``pub`` is matched against.

Patterns and filters are compiled once, when a subscription enters the cache (at start
from the store, then on each ``sub``); ``unsub`` and the sweep take them out. Matching
never touches the database. A subscription whose ``expires_at`` has passed matches
nothing and is reported back so the broker removes it (docs/protocol.md §6: "removed at
matching time").

A publish costs a dictionary lookup, not a scan of every subscription (with a
hundred subscribers on other subjects, a scan takes a tenth of the broker's time):
patterns without wildcards are indexed by their text, which a subject must equal to
match; only wildcard patterns are tried one by one. Expiry is found from a heap of
the entries by ``expires_at``, so a publish looks at expired entries only, not at all of them.

The filters one user's subscriptions evaluate per publish are bounded by their cost
(:func:`filter_cost`, the nodes a filter evaluates at most): a ``sub`` that would take
the user's live subscriptions past ``subscriptions.max_filter_cost`` is refused
(:meth:`SubscriptionMatcher.cost_refusal`), so a hundred subscriptions on ``#`` with
the longest filters cannot make every publish cost tens of milliseconds.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from mdeci.errors import FilterError, SubjectError
from mdeci.filters import (
    And,
    Attrs,
    Expr,
    Filter,
    MatchAll,
    Not,
    Or,
    compile_filter,
)
from mdeci.store.subscriptions import Subscription
from mdeci.subjects import SubjectMatcher, compile_pattern


def filter_cost(expr: Expr) -> int:
    """The nodes ``expr`` evaluates at most per publish: each comparison, test and
    operator counts 1 (the empty filter too: it is still called). The parser's depth
    limit bounds the recursion."""
    if isinstance(expr, Not):
        return 1 + filter_cost(expr.operand)
    if isinstance(expr, And | Or):
        return 1 + sum(filter_cost(operand) for operand in expr.operands)
    return 1


@dataclass(frozen=True, slots=True, eq=False)
class CompiledSubscription(Subscription):
    """A stored subscription with its pattern and filter compiled, in one object: a
    broker holds one per session, and a wrapper around the row cost 64 bytes more, a
    matcher object for a pattern without wildcards (matched by its text) 48 more. It is
    the cache's entry, never compared with the row it came from."""

    #: The compiled pattern; None when it has no wildcard (``subject`` is its text).
    matcher: SubjectMatcher | None = field(kw_only=True)
    accepts: Filter = field(kw_only=True)  # the compiled filter

    @classmethod
    def of(
        cls, sub: Subscription, pattern: SubjectMatcher | None, accepts: Filter
    ) -> CompiledSubscription:
        """``sub`` with ``pattern`` (compiled from its subject; None: without a wildcard)
        and ``accepts`` (from its filter)."""
        row = [getattr(sub, f.name) for f in fields(Subscription)]
        matcher = None if pattern is None or pattern.exact else pattern
        return cls(*row, matcher=matcher, accepts=accepts)

    @classmethod
    def compile(cls, sub: Subscription) -> CompiledSubscription:
        """Compile ``sub``'s subject and filter.

        Raises :class:`SubjectError` or :class:`FilterError` if either does not parse.
        """
        return cls.of(sub, compile_pattern(sub.subject), compile_filter(sub.filter))

    @property
    def exact(self) -> bool:
        """The pattern has no wildcard: it matches the one subject equal to it."""
        return self.matcher is None

    def matches(self, subject: str) -> bool:
        return subject == self.subject if self.matcher is None else self.matcher(subject)

    def __lt__(self, other: CompiledSubscription) -> bool:
        # The matcher's expiry heap holds the entries themselves, soonest first.
        return self.expires_at < other.expires_at


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Who gets a publish: ``targets`` as ``(uri, sub_id)`` by sub_id; ``expired`` ids seen."""

    targets: tuple[tuple[str, int], ...]
    expired: tuple[int, ...]


class SubscriptionMatcher:
    """Compiled subscriptions by id; see the module docstring."""

    def __init__(self) -> None:
        self._subs: dict[int, CompiledSubscription] = {}
        # The same entries, split: exact patterns by their text, wildcard ones by id. A
        # pattern of one subscription (a device's own subject) maps to the entry itself:
        # a dict of one costs 232 bytes per session.
        self._exact: dict[str, CompiledSubscription | dict[int, CompiledSubscription]] = {}
        self._wild: dict[int, CompiledSubscription] = {}
        # The ids of each user's entries, for the per-user cap: a scan of every entry per
        # ``sub`` made setting up N users' subscriptions quadratic. The usual one id as
        # it is, several as a tuple (not a set): the broker's memory is budgeted per
        # session (docs/benchmarks.md, "Memory per session").
        self._by_uri: dict[str, int | tuple[int, ...]] = {}
        # Every entry added, soonest expiry first; stale ones (discarded or replaced) are
        # skipped when popped. The entries, not (expires_at, id) pairs: no tuple each.
        self._expiry: list[CompiledSubscription] = []
        self.unusable: list[Subscription] = []  # stored ones that no longer compile
        # The targets of a subject, kept while they cannot depend on the attributes: its
        # exact subscriptions have no filter and no wildcard one exists (a fan-out's
        # hundred subscribers are not filtered, sorted and listed again per publish).
        # Emptied by every add and discard; only subjects equal to a pattern get in.
        self._plain: dict[str, tuple[tuple[str, int], ...]] = {}

    def __len__(self) -> int:
        return len(self._subs)

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._subs

    def get(self, sub_id: int) -> CompiledSubscription | None:
        """The cached subscription ``sub_id``, or None."""
        return self._subs.get(sub_id)

    def load(self, subs: Iterable[Subscription]) -> None:
        """Replace the cache with ``subs``.

        A stored subscription that does not compile (the grammar changed under it) is
        set aside in :attr:`unusable` rather than failing the broker's start.
        """
        for sub_id in list(self._subs):
            self.discard(sub_id)
        self._expiry.clear()
        self.unusable.clear()
        for sub in subs:
            try:
                self.add(CompiledSubscription.compile(sub))
            except (SubjectError, FilterError):
                self.unusable.append(sub)

    def add(self, compiled: CompiledSubscription) -> None:
        sub_id = compiled.sub_id
        self.discard(sub_id)
        self._plain.clear()
        self._subs[sub_id] = compiled
        uri = compiled.uri
        have = self._ids_of(uri)
        self._by_uri[uri] = (*have, sub_id) if have else sub_id
        if not compiled.exact:
            self._wild[sub_id] = compiled
        else:
            pattern = compiled.subject
            same = self._exact.get(pattern)
            if same is None:
                self._exact[pattern] = compiled
            elif isinstance(same, dict):
                same[sub_id] = compiled
            else:
                self._exact[pattern] = {same.sub_id: same, sub_id: compiled}
        heapq.heappush(self._expiry, compiled)

    def _ids_of(self, uri: str) -> tuple[int, ...]:
        ids = self._by_uri.get(uri, ())
        return (ids,) if isinstance(ids, int) else ids

    def count_of(self, uri: str, now: float) -> int:
        """Live subscriptions of ``uri`` (for the per-user cap)."""
        subs = self._subs
        return sum(1 for sub_id in self._ids_of(uri) if subs[sub_id].expires_at > now)

    def cost_refusal(self, uri: str, new: Filter, limit: int, now: float) -> str | None:
        """Why a subscription of ``uri`` with filter ``new`` is refused: its cost and
        that of ``uri``'s live subscriptions past ``limit``; None if within it."""
        cost = filter_cost(new.expr)
        subs = self._subs
        spent = sum(
            filter_cost(subs[i].accepts.expr) for i in self._ids_of(uri) if subs[i].expires_at > now
        )
        if spent + cost <= limit:
            return None
        return (
            f"filter cost limit reached: this filter costs {cost}, the live subscriptions "
            f"{spent}, at most {limit} per user"
        )

    def discard(self, sub_id: int) -> CompiledSubscription | None:
        """Remove ``sub_id``; the removed entry or None."""
        entry = self._subs.pop(sub_id, None)
        if entry is not None:
            uri = entry.uri
            rest = tuple(i for i in self._ids_of(uri) if i != sub_id)
            if rest:
                self._by_uri[uri] = rest if len(rest) > 1 else rest[0]
            else:
                del self._by_uri[uri]
            self._plain.clear()
            self._wild.pop(sub_id, None)
            pattern = entry.subject
            same = self._exact.get(pattern)
            if same is entry:
                del self._exact[pattern]
            elif isinstance(same, dict):
                same.pop(sub_id, None)
                if len(same) == 1:
                    (self._exact[pattern],) = same.values()
        return entry

    def match(self, subject: str, attrs: Attrs, now: float) -> MatchResult:
        """The live subscriptions whose pattern matches ``subject`` and filter ``attrs``.

        Expired ones (``expires_at <= now``, the store's rule) are dropped from the cache
        and listed in ``expired``. Never raises: compiled filters do not.
        """
        expired: list[int] = []
        heap = self._expiry
        while heap and heap[0].expires_at <= now:
            entry = heapq.heappop(heap)
            sub_id = entry.sub_id
            if self._subs.get(sub_id) is entry:
                expired.append(sub_id)
                self.discard(sub_id)
        plain = self._plain.get(subject)
        if plain is not None:
            return MatchResult(plain, tuple(sorted(expired)))
        # An exact pattern matches exactly the subject equal to its text.
        same = self._exact.get(subject)
        exact = () if same is None else same.values() if isinstance(same, dict) else (same,)
        found = [entry for entry in exact if entry.accepts(attrs)]
        found += [e for e in self._wild.values() if e.matches(subject) and e.accepts(attrs)]
        found.sort(key=lambda entry: entry.sub_id)
        targets = tuple((entry.uri, entry.sub_id) for entry in found)
        if (
            exact
            and not self._wild
            and all(isinstance(entry.accepts.expr, MatchAll) for entry in exact)
        ):
            self._plain[subject] = targets
        return MatchResult(targets, tuple(sorted(expired)))
