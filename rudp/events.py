"""What a connection reports: its events (pulled with ``RudpConnection.next_event``) and
its counters (``RudpConnection.stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, overload

if TYPE_CHECKING:
    from rudp.path import Address


@dataclass(frozen=True, slots=True)
class MessageReceived:
    data: bytes


@dataclass(frozen=True, slots=True)
class MessageAcked:
    """Messages ``message_id`` to ``message_id + count - 1`` are acknowledged: one event
    for all that one ACK's cumulative point passed (they are acknowledged in id order)."""

    message_id: int
    count: int = 1

    @property
    def last(self) -> int:
        """The highest id acknowledged."""
        return self.message_id + self.count - 1


@dataclass(frozen=True, slots=True)
class MessageFailed:
    message_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class PeerDisconnected:
    failed: int  # number of messages failed with it


@dataclass(frozen=True, slots=True)
class PeerRestarted:
    """While DISCONNECTED, an authentic datagram came under our key from another sender
    than the peer we gave up on: a new incarnation of the peer holding our key (or a
    replay of an older one; only a new association proves which)."""

    sender: int


@dataclass(frozen=True, slots=True)
class PathChallenged:
    """An authentic datagram came from ``address``, a new candidate path: it is challenged."""

    address: Address
    current: Address | None


@dataclass(frozen=True, slots=True)
class PathValidated:
    """``address`` answered our challenge from there: datagrams go to it from now on."""

    address: Address
    previous: Address | None


class _Rare:
    """A counter that stays 0 on most connections (a drop, a path change, a tail probe):
    kept in its stats' own table, built at the first count, not in a slot of every
    connection's (a broker holds a connection per session: 16 slots are 128 bytes each)."""

    __slots__ = ("name",)

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, stats: None, owner: type | None = None) -> _Rare: ...

    @overload
    def __get__(self, stats: RudpStats, owner: type | None = None) -> int: ...

    def __get__(self, stats: RudpStats | None, owner: type | None = None) -> int | _Rare:
        if stats is None:
            return self
        return 0 if stats.rare is None else stats.rare.get(self.name, 0)

    def __set__(self, stats: RudpStats, value: int) -> None:
        if stats.rare is None:
            stats.rare = {}
        stats.rare[self.name] = value


@dataclass(slots=True)
class RudpStats:
    """Counters of one connection (drops are counted here, never raised). The counters
    most connections never move are :class:`_Rare`: ``rare`` holds those that moved."""

    packets_sent: int = 0
    packets_received: int = 0
    data_sent: int = 0
    retransmissions: int = 0
    fast_retransmissions: int = 0
    timeouts: int = 0
    messages_sent: int = 0
    messages_delivered: int = 0
    messages_failed: int = 0
    acks_sent: int = 0
    pings_sent: int = 0
    rare: dict[str, int] | None = field(default=None, init=False)
    path_challenges_sent = _Rare()
    path_responses_sent = _Rare()
    path_responses_ignored = _Rare()  # not our token, or not from the challenged address
    bad_tag = _Rare()
    unknown_cid = _Rare()
    malformed = _Rare()
    oversized = _Rare()
    reflected = _Rare()
    unknown_sender = _Rare()
    replayed = _Rare()
    duplicates = _Rare()
    out_of_window = _Rare()
    bad_fragment = _Rare()
    buffer_full = _Rare()
    skipped = _Rare()
    tail_probes = _Rare()
