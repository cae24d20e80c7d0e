"""Failed-login throttling: bounded password guessing per user and per source address.

Sans-IO, monotonic clock injected (a lock is a duration). Two tables of the same kind:

- **sources**, keyed by address: the IPv4 address, or the /64 network of an IPv6 address
  (one host owns a /64, so its addresses count as one); the port is never part of it;
- **users**, keyed by username, for users that exist only (random usernames, which an
  attacker may send by the million, create no entry).

A key with ``max_failures`` failures within ``window`` seconds is locked for ``lockout``
seconds, doubling on each further lock up to ``max_lockout``; the doubling is forgotten
once the key has been quiet for ``max_lockout`` after its lock ended.

- A locked **source** is refused, unchecked, for every user.
- A locked **user** is refused, unchecked, from every source that is not *clean*. A clean
  source is one with no failure on record (and no lock within the doubling's memory); the
  user's correct password from it passes, so an attacker elsewhere cannot lock the owner
  out. A clean source gets one guess against a locked user: its failure makes it unclean.

Memory: each table holds at most ``max_keys`` entries. A new key takes the place of the
least recently touched entry that is not locked; a live lock is never dropped. When every
entry is a live lock, the new key is not recorded (:attr:`LoginThrottle.untracked`) and,
for as long as the source table is so full, no untracked source counts as clean (the
failure we could not record may have been its own).
"""

from __future__ import annotations

import heapq
import ipaddress
from collections import OrderedDict
from dataclasses import dataclass, field

from mdeci.config import LoginThrottleConfig

ThrottleConfig = LoginThrottleConfig  # ``[auth.throttle]``


def source_key(host: str) -> str:
    """The throttle's key for a source host: the IPv4 address, the /64 of an IPv6 one
    (an IPv4-mapped IPv6 address counts as its IPv4 address), else the lowered text."""
    if ":" not in host:
        return host.lower()  # IPv4 as the socket gives it (canonical), or a name
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return host.lower()
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass(slots=True)
class _Entry:
    failures: list[float] = field(default_factory=list)  # at most max_failures, oldest first
    locked_until: float = float("-inf")
    locks: int = 0


class _Table:
    """Bounded key table; see the module docstring for what it keeps and drops."""

    def __init__(self, config: ThrottleConfig) -> None:
        self.config = config
        self.entries: dict[str, _Entry] = {}
        self._unlocked: OrderedDict[str, None] = OrderedDict()  # LRU, oldest first
        self._expiries: list[tuple[float, str]] = []  # (locked_until, key) min-heap

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: str, now: float) -> _Entry | None:
        entry = self.entries.get(key)
        if entry is not None:
            self._age(entry, now)
        return entry

    def full_of_locks(self, now: float) -> bool:
        self._unlock_expired(now)
        return len(self.entries) >= self.config.max_keys and not self._unlocked

    def failed(self, key: str, now: float) -> bool | None:
        """Record a failure; True when it locked ``key``, None when it could not be
        recorded (every entry is a live lock)."""
        entry = self.get(key, now)
        if entry is None:
            entry = self._add(key, now)
            if entry is None:
                return None
        cfg = self.config
        entry.failures.append(now)
        self._age(entry, now)
        if len(entry.failures) < cfg.max_failures:
            self._touch(key)
            return False
        until = now + min(cfg.lockout * 2.0**entry.locks, cfg.max_lockout)
        entry.locked_until = max(entry.locked_until, until)
        entry.locks += 1
        entry.failures.clear()
        self._unlocked.pop(key, None)
        heapq.heappush(self._expiries, (entry.locked_until, key))
        return True

    def clear_failures(self, key: str) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.failures.clear()

    def _age(self, entry: _Entry, now: float) -> None:
        """Forget failures past the window and a doubling past its memory."""
        horizon = now - self.config.window
        if entry.failures and entry.failures[0] <= horizon:
            entry.failures = [t for t in entry.failures if t > horizon]
        if entry.locks and now - entry.locked_until > self.config.max_lockout:
            entry.locks = 0

    def _touch(self, key: str) -> None:
        if key in self._unlocked:
            self._unlocked.move_to_end(key)
        elif self.entries[key].locked_until == float("-inf"):
            self._unlocked[key] = None

    def _add(self, key: str, now: float) -> _Entry | None:
        if len(self.entries) >= self.config.max_keys:
            self._unlock_expired(now)
            if not self._unlocked:
                return None  # only live locks: refuse the new key, drop none
            old, _ = self._unlocked.popitem(last=False)
            del self.entries[old]
        entry = _Entry()
        self.entries[key] = entry
        self._unlocked[key] = None
        return entry

    def _unlock_expired(self, now: float) -> None:
        """Make entries whose lock ended droppable (most recently unlocked last)."""
        while self._expiries and self._expiries[0][0] <= now:
            until, key = heapq.heappop(self._expiries)
            entry = self.entries.get(key)
            if entry is not None and entry.locked_until == until:
                self._unlocked[key] = None


class LoginThrottle:
    """The source and user tables, and the rules that join them (module docstring).

    ``host`` arguments are the source's host (any port is ignored by :func:`source_key`).
    """

    def __init__(self, config: ThrottleConfig | None = None) -> None:
        self.config = config or ThrottleConfig()
        self._sources = _Table(self.config)
        self._users = _Table(self.config)
        self.locked_attempts = 0  # logins refused unchecked
        self.untracked = 0  # failures a table full of live locks could not record

    def __len__(self) -> int:
        """Keys remembered, both tables (each bounded by ``max_keys``)."""
        return len(self._sources) + len(self._users)

    def retry_after(self, user: str | None, host: str, now: float) -> float | None:
        """Seconds until this login may be checked, or None when it may be now."""
        source = self._sources.get(source_key(host), now)
        waits = []
        if source is not None and source.locked_until > now:
            waits.append(source.locked_until - now)
        account = None if user is None else self._users.get(user, now)
        if account is not None and account.locked_until > now and not self._clean(host, now):
            waits.append(account.locked_until - now)
        if waits:
            self.locked_attempts += 1
            return max(waits)
        return None

    def failed(self, user: str | None, host: str, now: float, *, known_user: bool) -> str:
        """Record a failed login; what it locked: ``""``, ``"source"``, ``"user"`` or
        ``"user and source"``. ``known_user``: the user exists (only then does the
        user's key count)."""
        locked: list[str] = []
        for name, table, key in (
            ("user", self._users, user if known_user else None),
            ("source", self._sources, source_key(host)),
        ):
            if key is None:
                continue
            result = table.failed(key, now)
            if result is None:
                self.untracked += 1
            elif result:
                locked.append(name)
        return " and ".join(locked)

    def succeeded(self, user: str) -> None:
        """A correct password: the user's failures so far are forgiven (its lock, which
        stands against other sources, is not)."""
        self._users.clear_failures(user)

    def user_locked_until(self, user: str, now: float) -> float | None:
        """When ``user``'s live lock ends, or None."""
        entry = self._users.get(user, now)
        return None if entry is None or entry.locked_until <= now else entry.locked_until

    @property
    def sizes(self) -> tuple[int, int]:
        """Entries in the source and the user table."""
        return len(self._sources), len(self._users)

    def _clean(self, host: str, now: float) -> bool:
        entry = self._sources.get(source_key(host), now)
        if entry is None:
            return not self._sources.full_of_locks(now)
        return not entry.failures and entry.locks == 0 and entry.locked_until <= now
