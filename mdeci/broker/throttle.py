"""Failed-login throttling (issue 12): bounded password guessing per user and per source.

Sans-IO, clock injected. Each failed login counts against its username and its source
address. A key with ``max_failures`` failures within ``window`` seconds is locked for
``lockout`` seconds (doubling on each further lock, up to ``max_lockout``): while either
key of a request is locked, its credentials are not even checked, so guesses during the
lock are worthless. A success does not reset the source (one source may guess for many
users) but does reset the user.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class ThrottleConfig:
    max_failures: int = 5
    window: float = 60.0
    lockout: float = 30.0
    max_lockout: float = 900.0
    max_keys: int = 10_000  # memory bound: the oldest keys are forgotten beyond it


@dataclass(slots=True)
class _Key:
    failures: deque[float] = field(default_factory=deque)
    locked_until: float = 0.0
    locks: int = 0


class LoginThrottle:
    """Counts failures by ``user:<name>`` and ``source:<addr>`` keys."""

    def __init__(self, config: ThrottleConfig | None = None) -> None:
        self.config = config or ThrottleConfig()
        self._keys: dict[str, _Key] = {}
        self.locked_attempts = 0

    def __len__(self) -> int:
        """Keys remembered (bounded by ``max_keys``)."""
        return len(self._keys)

    def retry_after(self, user: str | None, source: str, now: float) -> float | None:
        """Seconds until this user or source may try again, or None when allowed."""
        waits = [
            k.locked_until - now
            for name in self._names(user, source)
            if (k := self._keys.get(name)) is not None and k.locked_until > now
        ]
        if waits:
            self.locked_attempts += 1
            return max(waits)
        return None

    def failed(self, user: str | None, source: str, now: float) -> bool:
        """Record a failure; True when it locked the user or the source."""
        locked = False
        cfg = self.config
        for name in self._names(user, source):
            key = self._keys.pop(name, None) or _Key()
            self._keys[name] = key  # most recent last: eviction drops the oldest
            key.failures.append(now)
            while key.failures and key.failures[0] <= now - cfg.window:
                key.failures.popleft()
            if len(key.failures) >= cfg.max_failures:
                key.locked_until = now + min(cfg.lockout * 2**key.locks, cfg.max_lockout)
                key.locks += 1
                key.failures.clear()
                locked = True
        while len(self._keys) > cfg.max_keys:
            del self._keys[next(iter(self._keys))]
        return locked

    def succeeded(self, user: str) -> None:
        self._keys.pop(f"user:{user}", None)

    @staticmethod
    def _names(user: str | None, source: str) -> list[str]:
        return [f"source:{source}"] + ([f"user:{user}"] if user else [])
