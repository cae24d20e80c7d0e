"""Rate limit of the failed-login log: a guesser must not be able to fill the disk.

Sans-IO, monotonic clock injected. Time runs in intervals of ``interval`` seconds, the
first starting at the first failed login. Within an interval the first ``burst`` failed
logins get one line each; the others are counted, and once the interval is over one
summary says how many were left out, from how many sources and for how many users.
"""

from __future__ import annotations

from dataclasses import dataclass

DISTINCT_CAP = 10_000  # sources/users told apart per summary; more read as "at least"


@dataclass(frozen=True, kw_only=True, slots=True)
class LoginSummary:
    """Failed logins left out of the log during one interval."""

    suppressed: int
    sources: int  # distinct source keys (at most DISTINCT_CAP)
    users: int  # distinct usernames given (at most DISTINCT_CAP)
    interval: float


class LoginLog:
    """Decides which failed logins get a line (:meth:`note`) and when a summary is due
    (:meth:`summary`, :meth:`deadline`)."""

    def __init__(self, burst: int, interval: float) -> None:
        self.burst = burst
        self.interval = interval
        self._start: float | None = None
        self._logged = 0
        self._suppressed = 0
        self._sources: set[str] = set()
        self._users: set[str] = set()

    def note(self, now: float, source: str, user: str | None) -> bool:
        """A failed login at ``now``: True when it gets its own line. Call
        :meth:`summary` first, so an ended interval is summarised before a new one."""
        if self._start is None or now >= self._start + self.interval:
            self._start, self._logged = now, 0
        if self._logged < self.burst:
            self._logged += 1
            return True
        self._suppressed += 1
        if len(self._sources) < DISTINCT_CAP:
            self._sources.add(source)
        if user is not None and len(self._users) < DISTINCT_CAP:
            self._users.add(user)
        return False

    def deadline(self) -> float | None:
        """When the pending summary is due, or None when nothing was left out."""
        if self._start is None or not self._suppressed:
            return None
        return self._start + self.interval

    def summary(self, now: float, *, early: bool = False) -> LoginSummary | None:
        """The summary of the interval that has ended by ``now``, once; else None.
        ``early``: of the running interval too (at shutdown, so no count is lost)."""
        due = self.deadline()
        if due is None or (now < due and not early):
            return None
        done = LoginSummary(
            suppressed=self._suppressed,
            sources=len(self._sources),
            users=len(self._users),
            interval=self.interval,
        )
        self._suppressed = 0
        self._sources.clear()
        self._users.clear()
        return done
