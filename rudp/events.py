"""What a connection reports: its events (pulled with ``RudpConnection.next_event``) and
its counters (``RudpConnection.stats``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rudp.sparse import Sparse

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


@dataclass(slots=True)
class RudpStats:
    """Counters of one connection (drops are counted here, never raised). Those most
    connections never move are :class:`~rudp.sparse.Sparse`: ``sparse`` holds the ones
    that moved."""

    packets_sent: int = 0  # also the connection's next packet number (never reused)
    packets_received: int = 0
    data_sent: int = 0
    messages_sent: int = 0
    messages_delivered: int = 0
    acks_sent: int = 0
    pings_sent: int = 0
    sparse: dict[str, Any] | None = field(default=None, init=False)
    # Loss and failure: only on a path that loses.
    retransmissions = Sparse(0)
    fast_retransmissions = Sparse(0)
    timeouts = Sparse(0)
    messages_failed = Sparse(0)
    # Path changes, drops and tail probes.
    path_challenges_sent = Sparse(0)
    path_responses_sent = Sparse(0)
    path_responses_ignored = Sparse(0)  # not our token, or not from the challenged address
    bad_tag = Sparse(0)
    unknown_cid = Sparse(0)
    malformed = Sparse(0)
    oversized = Sparse(0)
    reflected = Sparse(0)
    unknown_sender = Sparse(0)
    replayed = Sparse(0)
    duplicates = Sparse(0)
    out_of_window = Sparse(0)
    bad_fragment = Sparse(0)
    buffer_full = Sparse(0)
    skipped = Sparse(0)
    tail_probes = Sparse(0)
