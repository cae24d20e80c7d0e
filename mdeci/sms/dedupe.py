"""The application-side exactly-once gate over ``nseq`` (docs/protocol.md §5), pure.

The same gate serves notifications arriving over IP and over SMS: a notification goes to
the application only if the gate accepts its ``nseq``, and the gate accepts a number at
most once. The caller persists :attr:`NseqGate.highest` and :attr:`NseqGate.recent`
(after delivering, before acknowledging) and builds the gate from them on restart.

``window = 0`` is the rule docs/protocol.md states: accept only ``nseq > highest``. That
never delivers twice, but over SMS, which reorders (and when urgent notifications go by
SMS while older ones wait in the broker's queue for IP), it throws away a notification
that arrives after a higher one. With ``window = W > 0`` the gate also accepts a number
within ``W`` below ``highest`` that it has not accepted yet, remembering those numbers
(an anti-replay window as in RFC 4303 §3.4.3); this is what exactly-once over SMS needs.
"""

from __future__ import annotations

from collections.abc import Iterable


class NseqGate:
    """Accepts each ``nseq`` at most once; see the module docstring for ``window``."""

    def __init__(self, highest: int = 0, *, window: int = 0, recent: Iterable[int] = ()) -> None:
        if window < 0:
            raise ValueError("window must be >= 0")
        self._highest = highest
        self._window = window
        self._recent = {n for n in recent if highest - window < n <= highest}

    @property
    def highest(self) -> int:
        """The highest ``nseq`` accepted so far."""
        return self._highest

    @property
    def window(self) -> int:
        """How far below :attr:`highest` an unseen number is still accepted."""
        return self._window

    def copy(self) -> NseqGate:
        """An independent gate in the same state (to roll back a burst not recorded)."""
        return NseqGate(self._highest, window=self._window, recent=self._recent)

    @property
    def recent(self) -> tuple[int, ...]:
        """Accepted numbers within the window (to persist with :attr:`highest`)."""
        return tuple(sorted(self._recent))

    def seen(self, nseq: int) -> bool:
        """Whether ``nseq`` would be refused (already accepted, or too old)."""
        if nseq > self._highest:
            return False
        return nseq <= self._highest - self._window or nseq in self._recent

    def accept(self, nseq: int) -> bool:
        """True (and remember it) if ``nseq`` may go to the application now."""
        if self.seen(nseq):
            return False
        if nseq > self._highest:
            self._highest = nseq
            floor = nseq - self._window
            self._recent = {n for n in self._recent if n > floor}
        if self._window:
            self._recent.add(nseq)
        return True
