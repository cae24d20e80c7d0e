"""The state of a :class:`~rudp.connection.RudpConnection`: every field, its type and its
initial value, in one place. The parts that act on it are mixins over these slots:
``rudp.connection`` (sending, input, timers), ``rudp.recovery`` (loss recovery),
``rudp.receiver`` (the receive window), ``rudp.path`` (the peer's address)."""

from __future__ import annotations

import functools
import hmac
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from rudp import packet as wire
from rudp.config import RudpConfig
from rudp.events import (
    MessageAcked,
    MessageFailed,
    MessageReceived,
    PathChallenged,
    PathValidated,
    PeerDisconnected,
    PeerRestarted,
    RudpStats,
)
from rudp.rto import RtoEstimator
from rudp.sparse import Sparse

if TYPE_CHECKING:
    from rudp.path import Address, PathWork

MAX_U32 = 0xFFFFFFFF
# New messages are refused past this packet number, leaving 2**24 numbers for the
# retransmissions and ACKs of what is in flight (packet numbers are never reused).
PN_LIMIT = MAX_U32 - (1 << 24)


def derive_connection_id(key: bytes) -> int:
    """The 64-bit connection id both sides derive from the session secret."""
    return int.from_bytes(hmac.digest(key, b"mdeci-rudp v2 connection id", "sha256")[:8], "big")


class _NoEntries(dict[Any, Any]):
    """The table of an idle connection: empty, shared by every connection, and never
    written (a write raises). A broker holds one connection per session; three empty
    dicts each would be ~200 bytes of every idle one. A writer builds the connection's
    own table first; ``datagrams_to_send`` puts this one back once a table empties."""

    __slots__ = ()

    def __setitem__(self, key: object, value: object) -> None:
        raise TypeError("the shared empty table is read-only")


NO_ENTRIES: dict[Any, Any] = _NoEntries()


class ConnectionState(Enum):
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


# One transition table (docs/protocol.md §4; failure after retries as RFC 6298 §5.5 back-off ends).
TRANSITIONS: dict[tuple[ConnectionState, str], ConnectionState] = {
    (ConnectionState.CONNECTED, "retries_exhausted"): ConnectionState.DISCONNECTED,
    (ConnectionState.CONNECTED, "reset"): ConnectionState.CONNECTED,
    (ConnectionState.DISCONNECTED, "reset"): ConnectionState.CONNECTED,
}

Event = (
    MessageReceived
    | MessageAcked
    | MessageFailed
    | PeerDisconnected
    | PeerRestarted
    | PathChallenged
    | PathValidated
)


@dataclass(slots=True)
class Outgoing:
    """One fragment of a message on the sending side, and its latest transmission."""

    seq: int
    message_id: int
    frag_index: int
    frag_count: int
    payload: bytes
    sent_at: float = -1.0
    pn: int = -1
    transmissions: int = 0
    sacked: bool = False


@dataclass(slots=True)
class Reassembly:
    """The fragments of the message being received, in order: built by its first
    fragment (a connection holds None between messages)."""

    count: int  # the message's fragments
    fragments: list[bytes] = field(default_factory=list)
    size: int = 0  # their bytes (the receive buffer's cap counts them)


class ConnectionFields:
    """The fields of one connection and the two writes every part makes: an event, a
    state transition."""

    # A broker holds one connection per session: no per-instance __dict__, and the
    # queues and lists are built on first use and dropped once empty (an empty deque is
    # 760 bytes, an empty list 56).
    __slots__ = (
        "_ack_deadline",
        "_ack_now",
        "_buffer",
        "_buffer_bytes",
        "_events",
        "_highest_pn",
        "_highest_reported",
        "_inflight",
        "_key",
        "_largest_acked_pn",
        "_last_sent",
        "_latest_rtt",
        "_loss_deadline",
        "_messages",
        "_next_message_id",
        "_next_pn",
        "_next_seq",
        "_parked",
        "_partial",
        "_path",
        "_peer_address",
        "_peer_key_iv",
        "_peer_keys_of",
        "_peer_sender",
        "_ping_now",
        "_pn_missing",
        "_probe",
        "_probe_pn",
        "_probed",
        "_pto_deadline",
        "_ranges",
        "_rcv_next",
        "_resend",
        "_retries",
        "_rto_deadline",
        "_sacked_ranges",
        "_send_aead",
        "_send_key_iv",
        "_sent_order",
        "_sizes",
        "_snd_una",
        "_unacked_in_order",
        "_unsent",
        "_waiting_since",
        "cid",
        "config",
        "rto",
        "sender_id",
        "sparse",
        "state",
        "stats",
    )

    # What nearly every connection leaves at its default, kept in ``sparse`` once set
    # (rudp.sparse): a broker holds a connection per session.
    path_changes: Sparse[int] = Sparse(0)  # candidates validated
    _challenges: Sparse[int] = Sparse(0)  # numbers the challenge tokens
    # Another incarnation heard under our key while the pinned peer still counted as
    # alive: reported (PeerRestarted) the moment we give the pinned one up.
    _restarted: Sparse[int | None] = Sparse(None)
    # We announced ourselves before hearing the peer: only DATA pins its sender.
    _spoke_first: Sparse[bool] = Sparse(False)

    def __init__(
        self,
        key: bytes,
        config: RudpConfig,
        *,
        sender_id: int,
        protection: wire.Protection = wire.Protection.AEAD,
        peer_address: Address | None = None,
    ) -> None:
        if len(key) < 16:
            raise ValueError("session key must have at least 16 bytes")
        self.config = config
        self.cid = derive_connection_id(key)
        self.sender_id = sender_id & MAX_U32
        self.state = ConnectionState.CONNECTED
        self.stats = RudpStats()
        self.rto = RtoEstimator(config)
        self._key = key
        # Keys as wire.key_iv ints, not wire.SenderKeys objects (64 bytes each, two per
        # session in a broker): ours, and those of the pinned or last-seen peer sender.
        self._send_key_iv = wire.key_iv(key, self.sender_id, protection)
        self._send_aead = protection is wire.Protection.AEAD
        self._peer_key_iv = 0
        self._peer_keys_of: int | None = None  # the sender _peer_key_iv is for
        # Where datagrams go; None when the caller tracks no addresses (no path validation).
        self._peer_address = peer_address
        self._path: PathWork | None = None  # built when another address speaks or we are challenged
        self.sparse: dict[str, Any] | None = None  # the Sparse attributes set
        self._sizes = sizes_of(config)
        self._events: deque[Event] | None = None  # built by _emit, dropped once drained
        # sender
        self._next_seq = 0
        self._snd_una = 0  # oldest unacknowledged (or unsent) sequence number
        self._next_message_id = 0
        # NO_ENTRIES while empty, in these three tables: an idle connection holds none.
        self._messages: dict[int, tuple[int, bytes]] = NO_ENTRIES  # id -> (last seq, data)
        self._unsent: deque[Outgoing] | None = None  # built by send_message, dropped once sent
        self._inflight: dict[int, Outgoing] = NO_ENTRIES
        self._resend: list[Outgoing] | None = None  # None when nothing is to be resent
        self._rto_deadline: float | None = None
        # While the RTO timer runs: when the wait for the peer began, or when it was last
        # heard from since (dead_after counts from there).
        self._waiting_since = 0.0
        self._retries = 0
        self._ping_now = False  # a keepalive PING went unanswered: probe again at once
        self._last_sent = 0.0
        self._largest_acked_pn = -1
        self._highest_reported = 0
        self._latest_rtt = 0.0
        # Incremental SACK and loss detection (each ACK costs O(blocks + newly acked), not
        # O(window)): the [start, end) ranges already marked SACKed; every transmission in
        # packet-number order (stale entries skipped lazily); and those past the pn/time
        # rules but above what the peer reported, by sequence number.
        self._sacked_ranges: Sequence[tuple[int, int]] = ()  # replaced, never changed
        # None while nothing is in flight: an emptied deque keeps a block of ~0.6 kB, and
        # an idle broker holds one association per session.
        self._sent_order: deque[tuple[int, Outgoing]] | None = None
        self._parked: list[tuple[int, int, Outgoing]] | None = None
        # Tail-loss probe (RFC 8985 §7): its timer, the packet chosen, its packet number.
        self._pto_deadline: float | None = None
        # RFC 9002 §6.1.2's loss timer: when the oldest packet past the packet-number rule
        # but still inside the time rule becomes old enough to be declared lost.
        self._loss_deadline: float | None = None
        self._probe: Outgoing | None = None
        self._probe_pn = -1
        self._probed = False  # one probe per episode without progress
        # receiver
        self._rcv_next = 0
        self._buffer: dict[int, wire.Data] = NO_ENTRIES
        self._buffer_bytes = 0
        # The buffer's seqs as sorted [start, end) runs; None when there are none.
        self._ranges: list[list[int]] | None = None
        self._partial: Reassembly | None = None  # the fragments of a message so far
        self._ack_deadline: float | None = None
        self._ack_now = False
        self._unacked_in_order = 0
        self._peer_sender: int | None = None
        self._highest_pn = -1
        self._pn_missing = 0  # the replay window (ReceiveWindow._commit_replay)

    def _transition(self, event: str) -> None:
        self.state = TRANSITIONS[(self.state, event)]

    def _emit(self, event: Event) -> None:
        if self._events is None:
            self._events = deque()
        self._events.append(event)


@dataclass(frozen=True, slots=True)
class Sizes:
    """Payload bytes per DATA packet, fragments per message and SACK blocks per ACK under
    one configuration: computed once per configuration and shared by its connections (one
    slot each, not three)."""

    payload: int
    max_fragments: int
    max_sack_blocks: int


@functools.cache
def sizes_of(config: RudpConfig) -> Sizes:
    """The :class:`Sizes` of ``config``."""
    payload = config.mtu - wire.DATA_OVERHEAD
    return Sizes(
        payload,
        -(-config.max_message_size // payload),
        min(config.max_sack_blocks, wire.max_sack_blocks(config.mtu)),
    )
