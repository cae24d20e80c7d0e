"""The in-memory cache of compiled subscriptions that every ``pub`` is matched against.

Patterns and filters are compiled once, when a subscription enters the cache (at start
from the store, then on each ``sub``); ``unsub`` and the sweep take them out. Matching
never touches the database. A subscription whose ``expires_at`` has passed matches
nothing and is reported back so the broker removes it (docs/protocol.md §6: "removed at
matching time").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mdeci.errors import FilterError, SubjectError
from mdeci.filters import Attrs, Filter, SubjectMatcher, compile_filter, compile_pattern
from mdeci.store.subscriptions import Subscription


@dataclass(frozen=True, slots=True)
class CompiledSubscription:
    """A stored subscription with its pattern and filter compiled."""

    sub: Subscription
    pattern: SubjectMatcher
    filter: Filter

    @classmethod
    def compile(cls, sub: Subscription) -> CompiledSubscription:
        """Compile ``sub``'s subject and filter.

        Raises :class:`SubjectError` or :class:`FilterError` if either does not parse.
        """
        return cls(sub, compile_pattern(sub.subject), compile_filter(sub.filter))


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Who gets a publish: ``targets`` as ``(uri, sub_id)`` by sub_id; ``expired`` ids seen."""

    targets: tuple[tuple[str, int], ...]
    expired: tuple[int, ...]


class SubscriptionMatcher:
    """Compiled subscriptions by id; see the module docstring."""

    def __init__(self) -> None:
        self._subs: dict[int, CompiledSubscription] = {}
        self.unusable: list[Subscription] = []  # stored ones that no longer compile

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
        self._subs.clear()
        self.unusable.clear()
        for sub in subs:
            try:
                self._subs[sub.sub_id] = CompiledSubscription.compile(sub)
            except (SubjectError, FilterError):
                self.unusable.append(sub)

    def add(self, compiled: CompiledSubscription) -> None:
        self._subs[compiled.sub.sub_id] = compiled

    def count_of(self, uri: str, now: float) -> int:
        """Live subscriptions of ``uri`` (for the per-user cap)."""
        return sum(1 for c in self._subs.values() if c.sub.uri == uri and c.sub.expires_at > now)

    def discard(self, sub_id: int) -> CompiledSubscription | None:
        """Remove ``sub_id``; the removed entry or None."""
        return self._subs.pop(sub_id, None)

    def match(self, subject: str, attrs: Attrs, now: float) -> MatchResult:
        """The live subscriptions whose pattern matches ``subject`` and filter ``attrs``.

        Expired ones (``expires_at <= now``, the store's rule) are dropped from the cache
        and listed in ``expired``. Never raises: compiled filters do not.
        """
        targets: list[tuple[str, int]] = []
        expired: list[int] = []
        for sub_id, entry in list(self._subs.items()):
            if entry.sub.expires_at <= now:
                expired.append(sub_id)
                del self._subs[sub_id]
            elif entry.pattern(subject) and entry.filter(attrs):
                targets.append((entry.sub.uri, sub_id))
        return MatchResult(tuple(targets), tuple(expired))
