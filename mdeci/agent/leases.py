"""When each subscription must be renewed, or has ended: a sans-IO table on a clock.

A subscription lives at the broker until its ``expires_at``. The application chooses,
per subscription, between a *lease* (the agent keeps it alive: it renews it at
:data:`RENEW_FRACTION` of each lifetime the broker grants, for as long as the
application does not cancel it) and a *fixed* lifetime (it ends at its TTL).

:class:`LeaseTable` holds, per ``sub_id``, the instant the broker's expiry falls at and
the instant to renew, both on the caller's monotonic clock (the caller turns the
broker's absolute ``expires_at`` into a lifetime with its wall clock when the answer
comes). It sends nothing and reads no clock: :meth:`LeaseTable.take_due` says what is
due at ``now``, :meth:`LeaseTable.deadline` when to ask again. Renewals go out only
while connected; a lease whose expiry passed before a renewal got through has
*lapsed*: the broker no longer matches it, and the caller subscribes it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RENEW_FRACTION = 2 / 3  # of the lifetime granted: a third of it is left for retries
RETRY_AFTER = 5.0  # seconds before a failed renewal (no answer, a temporary refusal) goes again


@dataclass(slots=True)
class Lease:
    """One subscription's times, on the caller's monotonic clock."""

    sub_id: str
    fixed: bool  # ends at its TTL: never renewed
    expires: float  # the broker's expiry
    # When to renew: before ``expires``, or after it once a try for a lapsed lease failed
    # (a fixed lease: its expiry).
    renew_at: float
    sending: bool = False  # a renewal, or a new subscription for it, is on its way


@dataclass(slots=True)
class Due:
    """What :meth:`LeaseTable.take_due` found due."""

    renew: list[str] = field(default_factory=list)  # leases to renew now (marked sending)
    lapsed: list[str] = field(default_factory=list)  # leases to subscribe again (sending)
    ended: list[str] = field(default_factory=list)  # fixed ones at their TTL (removed)


class LeaseTable:
    """The leases by ``sub_id``; see the module docstring."""

    def __init__(self) -> None:
        self._leases: dict[str, Lease] = {}

    def __contains__(self, sub_id: object) -> bool:
        return sub_id in self._leases

    def __len__(self) -> int:
        return len(self._leases)

    def get(self, sub_id: str) -> Lease | None:
        return self._leases.get(sub_id)

    def grant(self, sub_id: str, now: float, lifetime: float, *, fixed: bool) -> Lease:
        """The broker granted ``sub_id`` ``lifetime`` seconds from ``now`` (a new
        subscription or a renewal)."""
        expires = now + lifetime
        renew_at = expires if fixed else now + max(lifetime, 0.0) * RENEW_FRACTION
        lease = Lease(sub_id, fixed, expires, renew_at)
        self._leases[sub_id] = lease
        return lease

    def drop(self, sub_id: str) -> Lease | None:
        return self._leases.pop(sub_id, None)

    def lapsed(self, sub_id: str, now: float) -> bool:
        """``sub_id``'s expiry has passed (an unknown one too)."""
        lease = self._leases.get(sub_id)
        return lease is None or lease.expires <= now

    def failed(self, sub_id: str, now: float) -> None:
        """A renewal (or a new subscription for a lapsed lease) got no answer, or a
        temporary refusal: try again within :data:`RETRY_AFTER`, or half of what is left
        before the expiry, whichever is sooner (a lapsed one: after RETRY_AFTER)."""
        lease = self._leases.get(sub_id)
        if lease is not None:
            lease.sending = False
            if lease.fixed:
                return  # never renewed: it keeps its end
            left = lease.expires - now
            lease.renew_at = now + (min(RETRY_AFTER, left / 2) if left > 0 else RETRY_AFTER)

    def mark_sending(self, sub_id: str) -> bool:
        """Mark ``sub_id``'s request on its way; False if it already was (or is unknown)."""
        lease = self._leases.get(sub_id)
        if lease is None or lease.sending:
            return False
        lease.sending = True
        return True

    def disconnected_one(self, sub_id: str) -> None:
        """No answer will come to what is on its way for ``sub_id``."""
        lease = self._leases.get(sub_id)
        if lease is not None:
            lease.sending = False

    def disconnected(self) -> None:
        """No answer will come to what is on its way: it goes again once connected."""
        for lease in self._leases.values():
            lease.sending = False

    def take_due(self, now: float, *, connected: bool) -> Due:
        """What is due at ``now``: fixed leases at their expiry end (whatever the
        connection); while ``connected``, leases to renew and lapsed ones."""
        due = Due()
        for lease in list(self._leases.values()):
            if lease.fixed:
                if lease.expires <= now:
                    del self._leases[lease.sub_id]
                    due.ended.append(lease.sub_id)
            elif connected and not lease.sending and lease.renew_at <= now:
                lease.sending = True
                (due.lapsed if lease.expires <= now else due.renew).append(lease.sub_id)
        return due

    def deadline(self, *, connected: bool) -> float | None:
        """When :meth:`take_due` has something next (None: nothing scheduled). While
        disconnected only fixed leases' ends count: renewals wait for the connection."""
        times = [
            lease.renew_at
            for lease in self._leases.values()
            if lease.fixed or (connected and not lease.sending)
        ]
        return min(times, default=None)
