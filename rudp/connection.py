"""The sans-IO RUDP connection: sender, receiver, fragmentation, authentication.

Theory of operation (aioquic style): the caller feeds ``receive_datagram(data,
now)``, ``handle_timer(now)`` and ``send_message(data, now)``, then pulls
``datagrams_to_send(now)``, ``get_timer()`` and ``next_event()``. Nothing here
reads a clock, a socket or a random source; the random sender id is injected.

Sender: a message is cut into fragments, one sequence number each. Up to
``window`` sequence numbers past the oldest unacknowledged one are in flight.
ACKs carry a cumulative point and SACK ranges (RFC 2018 semantics). A packet
is declared lost and sent again at once when ``reorder_threshold`` packets sent
after it were acknowledged (fast retransmit, RFC 5681 §3.2 / RFC 9002 §6.1.1);
a lost tail is found by a tail-loss probe (RFC 8985 §7) after 2 SRTT without
progress. Each ACK costs O(SACK blocks + what it newly acknowledges), never
O(window) (docs/rudp.md §3). One retransmission timer runs as in RFC 6298 §5;
each expiry backs the RTO off and resends the oldest unacknowledged packet; expiry number
``max_retries + 1`` without progress fails every pending message, in order,
and the connection becomes DISCONNECTED. A message counts as delivered only
when the cumulative ACK passes its last fragment.

Receiver: packets below the cumulative point or already buffered are
duplicates; packets beyond the window are dropped; the rest wait in a
reordering buffer and leave in order into reassembly. ACKs are delayed
(``ack_delay``/``ack_every``) except for packets that open or fill a hole and
duplicates, which are acknowledged at once (RFC 5681 §4.2, RFC 9000 §13.2.1);
the SACK runs are kept up to date per packet. DATA carries the sender's
``base``: sequence numbers below it were abandoned by a failed send and are
skipped, so the stream resumes after ``reset()`` without a hole.

Security: every datagram is encrypted and authenticated (AES-256-GCM, header as
associated data) under a key derived from the session secret and the sender id
(``rudp.packet.SenderKeys``), and carries a per-sender packet number checked
against a sliding replay window.
The peer's sender id is pinned by its first authenticated packet: a packet
with another sender id (our own: a reflection; any other: a replay from an
earlier connection under the same key) is dropped, so replays can neither
reset the replay window nor redirect the peer. Every dropped datagram is
counted in exactly one ``RudpStats`` field and never raised.

Memory: the reordering buffer holds at most ``window`` packets of at most one
payload each, reassembly at most one message; ``max_buffer_bytes`` caps both
together (an in-order packet evicts out-of-order ones, which the sender
resends, so the cap cannot deadlock the stream).
"""

from __future__ import annotations

import bisect
import heapq
import hmac
from collections import deque
from dataclasses import dataclass
from enum import Enum

from rudp import packet as wire
from rudp.config import RudpConfig
from rudp.errors import MessageTooLarge, PacketError, PeerUnreachable
from rudp.rto import RtoEstimator

MAX_U32 = 0xFFFFFFFF
# New messages are refused past this packet number, leaving 2**24 numbers for the
# retransmissions and ACKs of what is in flight (packet numbers are never reused).
PN_LIMIT = MAX_U32 - (1 << 24)


def derive_connection_id(key: bytes) -> int:
    """The 64-bit connection id both sides derive from the session secret."""
    return int.from_bytes(hmac.digest(key, b"mdeci-rudp v2 connection id", "sha256")[:8], "big")


# What _detect_losses walks when nothing is in flight (never appended to).
_NO_ORDER: deque[tuple[int, _Outgoing]] = deque()


class ConnectionState(Enum):
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


# One transition table (docs/protocol.md §4; failure after retries as RFC 6298 §5.5 back-off ends).
TRANSITIONS: dict[tuple[ConnectionState, str], ConnectionState] = {
    (ConnectionState.CONNECTED, "retries_exhausted"): ConnectionState.DISCONNECTED,
    (ConnectionState.CONNECTED, "reset"): ConnectionState.CONNECTED,
    (ConnectionState.DISCONNECTED, "reset"): ConnectionState.CONNECTED,
}


@dataclass(frozen=True, slots=True)
class MessageReceived:
    data: bytes


@dataclass(frozen=True, slots=True)
class MessageAcked:
    message_id: int


@dataclass(frozen=True, slots=True)
class MessageFailed:
    message_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class PeerDisconnected:
    failed: int  # number of messages failed with it


@dataclass(frozen=True, slots=True)
class PathResponseReceived:
    """An authentic PATH_RESPONSE: the path it came over answered our challenge ``token``."""

    token: bytes


Event = MessageReceived | MessageAcked | MessageFailed | PeerDisconnected | PathResponseReceived


@dataclass(slots=True)
class RudpStats:
    """Counters of one connection (drops are counted here, never raised)."""

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
    path_challenges_sent: int = 0
    path_responses_sent: int = 0
    bad_tag: int = 0
    unknown_cid: int = 0
    malformed: int = 0
    oversized: int = 0
    reflected: int = 0
    unknown_sender: int = 0
    replayed: int = 0
    duplicates: int = 0
    out_of_window: int = 0
    bad_fragment: int = 0
    buffer_full: int = 0
    skipped: int = 0
    tail_probes: int = 0


@dataclass(slots=True)
class _Outgoing:
    seq: int
    message_id: int
    frag_index: int
    frag_count: int
    payload: bytes
    sent_at: float = -1.0
    pn: int = -1
    transmissions: int = 0
    sacked: bool = False


class RudpConnection:
    """One RUDP association keyed by a session key (see module docstring)."""

    # One connection per session in a broker (issue 14): no per-instance __dict__, and
    # the queues are built on first use (an empty deque is 760 bytes).
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
        "_max_fragments",
        "_max_sack_blocks",
        "_messages",
        "_next_message_id",
        "_next_pn",
        "_next_seq",
        "_parked",
        "_partial",
        "_partial_bytes",
        "_partial_count",
        "_path_responses",
        "_payload_size",
        "_peer_keys",
        "_peer_sender",
        "_ping_now",
        "_pn_bitmap",
        "_probe",
        "_probe_pn",
        "_probed",
        "_protection",
        "_pto_deadline",
        "_ranges",
        "_rcv_next",
        "_resend",
        "_retries",
        "_rto_deadline",
        "_sacked_ranges",
        "_send_keys",
        "_sent_order",
        "_snd_una",
        "_unacked_in_order",
        "_unsent",
        "cid",
        "config",
        "rto",
        "sender_id",
        "state",
        "stats",
    )

    def __init__(
        self,
        key: bytes,
        config: RudpConfig,
        *,
        sender_id: int,
        protection: wire.Protection = wire.Protection.AEAD,
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
        self._protection = protection
        self._send_keys = wire.SenderKeys(key, self.sender_id, protection)
        self._peer_keys: wire.SenderKeys | None = None  # of the pinned or last-seen sender
        self._path_responses: list[bytes] = []  # tokens of challenges to answer
        self._payload_size = config.mtu - wire.DATA_OVERHEAD
        self._max_fragments = -(-config.max_message_size // self._payload_size)
        self._max_sack_blocks = min(config.max_sack_blocks, wire.max_sack_blocks(config.mtu))
        self._events: deque[Event] | None = None  # built by _emit, dropped once drained
        # sender
        self._next_pn = 0
        self._next_seq = 0
        self._snd_una = 0  # oldest unacknowledged (or unsent) sequence number
        self._next_message_id = 0
        self._messages: dict[int, tuple[int, bytes]] = {}  # id -> (last seq, data)
        self._unsent: deque[_Outgoing] | None = None  # built by send_message, dropped once sent
        self._inflight: dict[int, _Outgoing] = {}
        self._resend: list[_Outgoing] = []
        self._rto_deadline: float | None = None
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
        self._sacked_ranges: list[tuple[int, int]] = []
        # None while nothing is in flight: an emptied deque keeps a block of ~0.6 kB, and
        # an idle broker holds one association per session (issue 14, criterion 7).
        self._sent_order: deque[tuple[int, _Outgoing]] | None = None
        self._parked: list[tuple[int, int, _Outgoing]] = []
        # Tail-loss probe (RFC 8985 §7): its timer, the packet chosen, its packet number.
        self._pto_deadline: float | None = None
        # RFC 9002 §6.1.2's loss timer: when the oldest packet past the packet-number rule
        # but still inside the time rule becomes old enough to be declared lost.
        self._loss_deadline: float | None = None
        self._probe: _Outgoing | None = None
        self._probe_pn = -1
        self._probed = False  # one probe per episode without progress
        # receiver
        self._rcv_next = 0
        self._buffer: dict[int, wire.Data] = {}
        self._buffer_bytes = 0
        self._ranges: list[list[int]] = []  # the buffer's seqs as sorted [start, end) runs
        self._partial: list[bytes] = []
        self._partial_count = 0
        self._partial_bytes = 0
        self._ack_deadline: float | None = None
        self._ack_now = False
        self._unacked_in_order = 0
        self._peer_sender: int | None = None
        self._highest_pn = -1
        self._pn_bitmap = 0

    # ---------------------------------------------------------------- commands

    @property
    def connected(self) -> bool:
        return self.state is ConnectionState.CONNECTED

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes held for the peer: reordering buffer plus partial reassembly."""
        return self._buffer_bytes + self._partial_bytes

    @property
    def payload_size(self) -> int:
        """Message bytes per DATA packet: ``mtu`` less header, DATA fields and tag."""
        return self._payload_size

    def _transition(self, event: str) -> None:
        self.state = TRANSITIONS[(self.state, event)]

    def send_message(self, data: bytes, now: float) -> int:
        """Queue ``data``; return its message id.

        Raises PeerUnreachable when DISCONNECTED, MessageTooLarge above max_message_size.
        """
        if self.state is ConnectionState.DISCONNECTED:
            raise PeerUnreachable("peer is disconnected; call reset()", data)
        if len(data) > self.config.max_message_size:
            raise MessageTooLarge(f"{len(data)} > {self.config.max_message_size} bytes")
        if self._next_seq + self._max_fragments > MAX_U32 or self._next_pn > PN_LIMIT:
            raise PeerUnreachable("sequence space exhausted; re-key the session", data)
        message_id = self._next_message_id
        self._next_message_id += 1
        size = self._payload_size
        if self._unsent is None:
            self._unsent = deque()
        seq = self._next_seq
        if len(data) <= size:  # one fragment, the usual case: no slicing, no loop
            self._unsent.append(_Outgoing(seq, message_id, 0, 1, data))
        else:
            count = -(-len(data) // size)
            for index in range(count):
                self._unsent.append(
                    _Outgoing(
                        seq + index,
                        message_id,
                        index,
                        count,
                        data[index * size : (index + 1) * size],
                    )
                )
            seq += count - 1
        self._next_seq = seq + 1
        self._messages[message_id] = (seq, data)
        self.stats.messages_sent += 1
        return message_id

    def is_pending(self, message_id: int) -> bool:
        """Whether message ``message_id`` is neither acknowledged nor failed yet."""
        return message_id in self._messages

    def reset(self, now: float) -> None:
        """Leave DISCONNECTED: forget the failure and the RTT history so sending resumes."""
        self._transition("reset")
        self._retries = 0
        self.rto.clear()

    def path_changed(self, now: float) -> None:
        """The peer is reachable at another address from now on (or we are: our own
        address changed). What is in flight went over the old path and may be gone with
        it: resend every packet the peer has not reported received at once, and give the
        new path a fresh retry budget and an RTO without back-off. The RTT samples stay
        (a new path's first ACKs correct them within a few packets; forgetting them would
        make the first loss on the new path cost ``rto_initial``). Also ACK at once, so
        the peer learns what we hold over the new path. Nothing happens while
        DISCONNECTED (``reset`` is the way back from there).
        """
        if self.state is not ConnectionState.CONNECTED:
            return
        self._retries = 0
        self.rto.undo_back_off()
        self._resend = sorted(
            (o for o in self._inflight.values() if not o.sacked), key=lambda o: o.seq
        )
        self._rto_deadline = now + self.rto.rto if self._inflight else None
        if self._peer_sender is not None:
            self._ack_now = True

    # ---------------------------------------------------------------- input

    def receive_datagram(self, data: bytes, now: float) -> bool:
        """Process one datagram. Return True when it authenticated and is the newest seen.

        The adapter follows the peer to the datagram's source address only on True,
        so a replayed old packet cannot redirect the peer. Never raises: a dropped
        datagram is counted in one ``stats`` field.
        """
        if len(data) > self.config.mtu:
            self.stats.oversized += 1  # no conforming peer writes more than mtu bytes
            return False
        try:
            header = wire.pull_header(data)
        except PacketError:
            self.stats.malformed += 1
            return False
        if header.cid != self.cid:
            self.stats.unknown_cid += 1
            return False
        payload = self._keys_for(header.sender).open(data, header.pn)
        if payload is None:
            self.stats.bad_tag += 1
            return False
        if header.sender == self.sender_id:
            self.stats.reflected += 1
            return False
        if self._peer_sender is not None and header.sender != self._peer_sender:
            # Not the incarnation we talk to: a replay from an earlier connection under
            # this key. Accepting it would reset the replay window (module docstring).
            self.stats.unknown_sender += 1
            return False
        fresh = self._check_replay(header.pn)
        if fresh is None:
            self.stats.replayed += 1
            return False
        try:
            frames = wire.pull_frames(payload)
        except PacketError:
            self.stats.malformed += 1
            return False
        # Every check before any effect: a datagram counts whole. One pass; a bad ACK
        # (malformed) outranks a bad fragment, as two passes would rank them.
        bad_fragment = False
        sent_end = self._next_seq
        for frame in frames:
            if isinstance(frame, wire.Data):
                bad_fragment = bad_fragment or not self._data_ok(frame)
            elif isinstance(frame, wire.Ack) and (
                # blocks ascend (pull_frames checks it): the last one ends highest
                frame.cumulative > sent_end or (frame.blocks and frame.blocks[-1][1] > sent_end)
            ):
                self.stats.malformed += 1  # an ACK for data never sent
                return False
        if bad_fragment:
            self.stats.bad_fragment += 1
            return False
        for frame in frames:
            if isinstance(frame, wire.Data):
                self._on_data(frame, now)
            elif isinstance(frame, wire.Ack):
                self._on_ack(frame, now, newest=fresh)
            elif isinstance(frame, wire.Ping):
                self._ack_now = True
            elif isinstance(frame, wire.PathChallenge):
                self._path_responses.append(frame.token)
            else:
                self._emit(PathResponseReceived(frame.token))
        self._commit_replay(header.pn)
        self._peer_sender = header.sender
        self.stats.packets_received += 1
        if self._rto_deadline is not None and not self._inflight:
            # Only a keepalive probe was outstanding, and the peer is alive.
            self._rto_deadline = None
            self._retries = 0
        return fresh

    def _keys_for(self, sender: int) -> wire.SenderKeys:
        if sender == self.sender_id:
            return self._send_keys  # a reflection authenticates; counted as such after
        keys = self._peer_keys
        if keys is None or keys.sender != sender:
            # One HKDF per new sender id; the pinned peer's keys stay cached (the check
            # against the pinned id comes after authentication, as before: step 6).
            keys = wire.SenderKeys(self._key, sender, self._protection)
            if self._peer_sender is None or sender == self._peer_sender:
                self._peer_keys = keys
        return keys

    def _check_replay(self, pn: int) -> bool | None:
        """None: replay; True: newest so far; False: older but not seen (reordered)."""
        if pn > self._highest_pn:
            return True
        offset = self._highest_pn - pn
        if offset >= self.config.replay_window or (self._pn_bitmap >> offset) & 1:
            return None
        return False

    def _commit_replay(self, pn: int) -> None:
        mask = (1 << self.config.replay_window) - 1
        if pn > self._highest_pn:
            shift = pn - self._highest_pn if self._highest_pn >= 0 else 0
            if shift >= self.config.replay_window:
                self._pn_bitmap = 1  # a jump past the window forgets it (bounded shift)
            else:
                self._pn_bitmap = ((self._pn_bitmap << shift) | 1) & mask
            self._highest_pn = pn
        else:
            self._pn_bitmap |= 1 << (self._highest_pn - pn)

    def _data_ok(self, d: wire.Data) -> bool:
        """False (counted in ``bad_fragment``) when a DATA frame's fields are absurd."""
        return not (
            d.frag_count == 0
            or d.frag_index >= d.frag_count
            or d.frag_count > self._max_fragments
            or len(d.payload) > self._payload_size
            or d.base > d.seq
        )

    def _on_data(self, d: wire.Data, now: float) -> None:
        """Take one (checked) DATA frame."""
        if d.base > self._rcv_next:
            # The sender abandoned [rcv_next, base) after a failure: skip it (module doc).
            self.stats.skipped += d.base - self._rcv_next
            for seq in [s for s in self._buffer if s < d.base]:
                self._buffer_bytes -= len(self._buffer.pop(seq).payload)
            self._drop_partial()
            self._rcv_next = d.base
            self._rebuild_ranges()
        if d.seq < self._rcv_next or d.seq in self._buffer:
            self.stats.duplicates += 1
            self._ack_now = True
            return
        if d.seq >= self._rcv_next + self.config.window:
            self.stats.out_of_window += 1
            self._ack_now = True
            return
        if self.buffered_bytes + len(d.payload) > self.config.max_buffer_bytes:
            if d.seq != self._rcv_next:
                self.stats.buffer_full += 1
                self._ack_now = True  # tell the sender what we hold (it may have been reneged)
                return
            # The in-order packet always fits: evict the highest out-of-order ones (the
            # sender resends them) rather than stall. RudpConfig guarantees room once the
            # buffer is empty (max_buffer_bytes >= max_message_size + mtu).
            for seq in sorted(self._buffer, reverse=True):
                if self.buffered_bytes + len(d.payload) <= self.config.max_buffer_bytes:
                    break
                self._buffer_bytes -= len(self._buffer.pop(seq).payload)
                self.stats.buffer_full += 1
            self._rebuild_ranges()
        self._buffer[d.seq] = d
        self._buffer_bytes += len(d.payload)
        if d.seq != self._rcv_next:
            if self._add_to_ranges(d.seq):
                self._ack_now = True  # a new hole, or one filled: tell the sender at once
            else:
                self._unacked_in_order += 1  # more above the same hole: ACK every ack_every
        elif self._ranges and self._ranges[0][0] == d.seq + 1:
            del self._ranges[0]  # the run after the hole leaves with this packet
            self._ack_now = True  # a hole filled (RFC 5681 §4.2): the sender is waiting
        while self._rcv_next in self._buffer:
            frag = self._buffer.pop(self._rcv_next)
            self._buffer_bytes -= len(frag.payload)
            self._rcv_next += 1
            self._unacked_in_order += 1
            self._reassemble(frag)
        if self._unacked_in_order >= self.config.ack_every:
            self._ack_now = True
        elif self._ack_deadline is None:
            self._ack_deadline = now + self.config.ack_delay

    def _add_to_ranges(self, seq: int) -> bool:
        """Record out-of-order ``seq`` in the SACK runs. True when it opens a new hole or
        fills one (ACK at once, as RFC 9000 §13.2.1); False when it extends the highest
        run, the common case while a hole is open (then ACKs follow ``ack_every``)."""
        ranges = self._ranges
        if ranges and ranges[-1][1] == seq:
            ranges[-1][1] = seq + 1
            return False
        i = bisect.bisect_right(ranges, seq, key=lambda run: run[0])
        joins_left = i > 0 and ranges[i - 1][1] == seq
        joins_right = i < len(ranges) and ranges[i][0] == seq + 1
        if joins_left and joins_right:
            ranges[i - 1][1] = ranges[i][1]
            del ranges[i]
        elif joins_left:
            ranges[i - 1][1] = seq + 1
        elif joins_right:
            ranges[i][0] = seq
        else:
            ranges.insert(i, [seq, seq + 1])
        return True

    def _rebuild_ranges(self) -> None:
        """Recompute the SACK runs from the buffer (after the rare bulk removals)."""
        self._ranges = []
        for seq in sorted(self._buffer):
            if self._ranges and self._ranges[-1][1] == seq:
                self._ranges[-1][1] = seq + 1
            else:
                self._ranges.append([seq, seq + 1])

    def _drop_partial(self) -> None:
        self._partial = []
        self._partial_count = 0
        self._partial_bytes = 0

    def _reassemble(self, frag: wire.Data) -> None:
        if frag.frag_count == 1 and not self._partial:  # a whole message: the common case
            self.stats.messages_delivered += 1
            self._emit(MessageReceived(frag.payload))
            return
        if frag.frag_index == 0:
            if self._partial:
                self.stats.bad_fragment += 1
                self._drop_partial()
            self._partial_count = frag.frag_count
        elif frag.frag_index != len(self._partial) or frag.frag_count != self._partial_count:
            self.stats.bad_fragment += 1
            self._drop_partial()
            return
        self._partial.append(frag.payload)
        self._partial_bytes += len(frag.payload)
        if len(self._partial) == self._partial_count:
            message = b"".join(self._partial)
            self._drop_partial()
            self.stats.messages_delivered += 1
            self._emit(MessageReceived(message))

    def _on_ack(self, ack: wire.Ack, now: float, *, newest: bool) -> None:
        progress = False
        sample: _Outgoing | None = None
        largest_pn = self._largest_acked_pn
        if ack.cumulative > self._snd_una:
            progress = True
            pop = self._inflight.pop
            for seq in range(self._snd_una, ack.cumulative):
                out = pop(seq, None)
                if out is None:
                    continue
                if out.pn > largest_pn:
                    largest_pn = out.pn
                if out.transmissions == 1 and not out.sacked:
                    sample = out
            self._snd_una = ack.cumulative
            if self._resend:
                self._resend = [o for o in self._resend if o.seq >= self._snd_una]
            self._sacked_ranges = _subtract(self._sacked_ranges, [(0, self._snd_una)])
            # The pending ids are always the newest len(messages) ones (acks remove the
            # oldest, a failure all): the oldest is known without iterating the dict,
            # whose deleted head entries a next(iter()) would walk again on every call.
            messages = self._messages
            first = self._next_message_id - len(messages)
            if messages and messages[first][0] < self._snd_una:
                if self._events is None:
                    self._events = deque()
                emit = self._events.append  # _emit's work, once for all of them
                while messages and messages[first][0] < self._snd_una:
                    del messages[first]
                    emit(MessageAcked(first))
                    first += 1
        # Only in-flight sequence numbers matter: bounds the work one ACK can cause.
        top = min(self._snd_una + self.config.window, self._sent_end())
        blocks = [
            (max(start, self._snd_una), min(end, top))
            for start, end in ack.blocks
            if max(start, self._snd_una) < min(end, top)
        ]
        if newest and self._sacked_ranges:
            # The gaps below the last block are what the receiver lacks now. A packet we
            # took as SACKed in a gap was reneged (dropped by the buffer cap): SACK is
            # advisory (RFC 2018 §8), and the receiver surely lacks it: resend it.
            # With no blocks, only the packet at the cumulative point is known missing.
            below = ack.blocks[-1][1] if ack.blocks else ack.cumulative + 1
            candidates = _subtract(self._sacked_ranges, [(below, MAX_U32 + 1)])
            reneged = _subtract(candidates, blocks)
            for start, end in reneged:
                for seq in range(start, end):
                    out = self._inflight.get(seq)
                    if out is not None and out.sacked:
                        out.sacked = False
                        self._resend.append(out)
                        self.stats.fast_retransmissions += 1
            if reneged:
                self._sacked_ranges = _subtract(self._sacked_ranges, reneged)
                self._resend.sort(key=lambda o: o.seq)
        fresh = _subtract(blocks, self._sacked_ranges)  # what this ACK newly reports
        for start, end in fresh:
            for seq in range(start, end):
                out = self._inflight.get(seq)
                if out is not None and not out.sacked:
                    out.sacked = True
                    progress = True
                    largest_pn = max(largest_pn, out.pn)
                    if out.transmissions == 1 and (sample is None or out.seq > sample.seq):
                        sample = out
        if fresh:
            self._sacked_ranges = _union(self._sacked_ranges, fresh)
        if sample is not None:
            # Karn's rule (RFC 6298 §3): only packets sent once give samples.
            self._latest_rtt = now - sample.sent_at
            self.rto.on_sample(self._latest_rtt)
        if progress:
            self._retries = 0
            self._probed = False
            # RFC 6298 §5.3: restart the timer when new data is acknowledged.
            self._rto_deadline = now + self.rto.rto if self._inflight else None
            self._arm_probe(now)
        if ack.blocks:
            self._highest_reported = max(self._highest_reported, ack.blocks[-1][1])
        self._largest_acked_pn = max(self._largest_acked_pn, largest_pn)
        if progress:
            self._detect_losses(now)

    def _sent_end(self) -> int:
        """One past the highest sequence number ever sent."""
        return self._unsent[0].seq if self._unsent else self._next_seq

    def _detect_losses(self, now: float) -> None:
        # RFC 9002 §6.1 style: lost when `reorder_threshold` later-sent packets were acked
        # AND it is older than reorder_time * max(SRTT, latest RTT), so link jitter that
        # reorders packets does not trigger spurious retransmissions; and only below the
        # highest sequence the peer reported (SACK lists its lowest ranges only). Once a
        # tail-loss probe is acknowledged, one later-sent packet is enough: the probe
        # went out after PTO of silence, which reordering does not explain (RFC 8985).
        # Transmissions are visited in packet-number order (so in send-time order too)
        # and each leaves the queue once: the work per ACK is what it declares, not the
        # window.
        limit = self._largest_acked_pn - self.config.reorder_threshold
        if 0 <= self._probe_pn <= self._largest_acked_pn:
            limit = max(limit, self._probe_pn - 1)
        rtt = max(self.rto.srtt or self.config.rto_initial, self._latest_rtt)
        age = self.config.reorder_time * rtt  # lost only once sent_at + age <= now
        lost: list[_Outgoing] = []
        order = self._sent_order or _NO_ORDER
        self._loss_deadline = None
        while order:
            pn, out = order[0]
            if out.pn != pn or out.sacked or out.seq < self._snd_una:
                order.popleft()  # sent again since, or received: nothing to decide
                continue
            if pn > limit:
                break
            if out.sent_at + age > now:
                # Too young to call lost yet. Without a timer for when it is not, a burst
                # whose last ACKs came in before it aged (every RTT sample of a burst sent
                # at once measures the burst itself) would wait for the probe or the RTO.
                # The same sum as the test above, so the timer firing at it passes it.
                self._loss_deadline = out.sent_at + age
                break
            order.popleft()
            if out.seq >= self._highest_reported:
                heapq.heappush(self._parked, (out.seq, pn, out))  # decided when reported
            else:
                lost.append(out)
        if not order:
            self._sent_order = None
        parked = self._parked
        while parked and parked[0][0] < self._highest_reported:
            seq, pn, out = heapq.heappop(parked)
            if out.pn == pn and not out.sacked and seq >= self._snd_una:
                lost.append(out)
        if lost:
            queued = {o.seq for o in self._resend}
            for out in lost:
                if out.seq not in queued:
                    self._resend.append(out)
                    self.stats.fast_retransmissions += 1
            self._resend.sort(key=lambda o: o.seq)

    def _arm_probe(self, now: float) -> None:
        """(Re)start the tail-loss probe timer: PTO = 2 SRTT + the peer's ACK delay after
        the last new data sent or the last ACK progress (RFC 8985 §7.2), while data is
        in flight and it would fire before the RTO."""
        srtt = self.rto.srtt
        if srtt is None or not self._inflight or self._probed or not self.config.tail_probe:
            self._pto_deadline = None
            return
        pto = now + max(2 * srtt, self.config.granularity) + self.config.ack_delay
        rto = self._rto_deadline
        self._pto_deadline = pto if rto is None or pto < rto else None

    # ---------------------------------------------------------------- timers

    def get_timer(self) -> float | None:
        """The next time ``handle_timer`` must run, or None."""
        times = [
            t
            for t in (
                self._rto_deadline,
                self._ack_deadline,
                self._pto_deadline,
                self._loss_deadline,
            )
            if t is not None
        ]
        if self.config.keepalive_interval > 0 and self.state is ConnectionState.CONNECTED:
            times.append(self._last_sent + self.config.keepalive_interval)
        return min(times) if times else None

    def handle_timer(self, now: float) -> None:
        if self._ack_deadline is not None and now >= self._ack_deadline:
            self._ack_now = True
        if self._rto_deadline is not None and now >= self._rto_deadline:
            self._on_rto(now)
        elif self._loss_deadline is not None and now >= self._loss_deadline:
            self._detect_losses(now)  # RFC 9002 §6.2.1: the loss timer comes before the PTO
        elif self._pto_deadline is not None and now >= self._pto_deadline:
            self._on_probe_timeout()

    def _on_probe_timeout(self) -> None:
        """No ACK progress for PTO with data in flight: probe with the newest packet the
        peer has not reported (RFC 8985 §7.3). Its ACK shows the holes before it, which
        :meth:`_detect_losses` then declares lost: a lost tail costs ~PTO + RTT, not an
        RTO with its back-off. No back-off, no retry counted; one probe per episode."""
        self._pto_deadline = None
        self._probed = True
        for out in reversed(self._inflight.values()):
            if not out.sacked:
                break
        else:
            return
        self.stats.tail_probes += 1
        self._probe = out
        if all(o is not out for o in self._resend):
            self._resend.append(out)

    def _on_rto(self, now: float) -> None:
        self.stats.timeouts += 1
        self._retries += 1
        if self._retries > self.config.max_retries:
            self._fail(now)
            return
        self.rto.back_off()  # RFC 6298 §5.5
        # Nothing in flight: the timer guards an unanswered keepalive PING; send another.
        self._ping_now = not self._inflight
        # RFC 6298 §5.4 resends the earliest unacknowledged packet, SACKed or not (SACK is
        # advisory, RFC 2018 §8); with SACK knowledge every packet not reported received is
        # resent too (as TCP does after an RTO, RFC 6675 §5.1), so a lost tail does not cost
        # one backed-off timeout per packet.
        pending = sorted(self._inflight.values(), key=lambda o: o.seq)
        self._resend = [o for i, o in enumerate(pending) if i == 0 or not o.sacked]
        if self._resend:
            first = self._resend[0]
            first.sacked = False
            self._sacked_ranges = _subtract(self._sacked_ranges, [(first.seq, first.seq + 1)])
        self._rto_deadline = now + self.rto.rto  # RFC 6298 §5.6
        self._pto_deadline = None
        self._loss_deadline = None  # everything not reported received is resent already
        self._probed = False

    def _fail(self, now: float) -> None:
        self._transition("retries_exhausted")
        failed = 0
        for message_id, (_, data) in self._messages.items():
            self._emit(MessageFailed(message_id, data))
            failed += 1
        self.stats.messages_failed += failed
        self._messages.clear()
        self._unsent = None
        self._inflight.clear()
        self._resend.clear()
        self._sacked_ranges = []
        self._sent_order = None
        self._parked = []
        self._probe = None
        self._snd_una = self._next_seq  # abandoned; DATA's base tells the receiver
        self._rto_deadline = None
        self._pto_deadline = None
        self._loss_deadline = None
        self._emit(PeerDisconnected(failed))

    # ---------------------------------------------------------------- output

    def _packet(self, frames: list[bytes], now: float) -> bytes:
        """One datagram of encoded ``frames``, numbered with the next packet number."""
        pn = self._next_pn
        self._next_pn += 1
        self._last_sent = now
        self.stats.packets_sent += 1
        return wire.seal_encoded(self._send_keys, self.cid, pn, frames)

    def path_challenge(self, token: bytes, now: float) -> bytes:
        """A datagram carrying PATH_CHALLENGE ``token`` (8 bytes), for the adapter to send
        to a candidate address; an authentic PATH_RESPONSE with it becomes a
        :class:`PathResponseReceived` event. Not retransmitted by the core."""
        if len(token) != wire.TOKEN_SIZE:
            raise ValueError(f"a path token is {wire.TOKEN_SIZE} bytes")
        self.stats.path_challenges_sent += 1
        return self._packet([wire.push_frame(wire.PathChallenge(token))], now)

    def _data_frame(self, out: _Outgoing, now: float, pn: int) -> bytes:
        """``out`` as a DATA frame of the packet numbered ``pn`` being built."""
        if out.transmissions:
            self.stats.retransmissions += 1
        out.transmissions += 1
        out.sent_at = now
        out.pn = pn
        if self._sent_order is None:
            self._sent_order = deque()
        self._sent_order.append((out.pn, out))
        self.stats.data_sent += 1
        if self._rto_deadline is None:
            self._rto_deadline = now + self.rto.rto  # RFC 6298 §5.1
        return wire.push_data(out.seq, self._snd_una, out.frag_index, out.frag_count, out.payload)

    def _ack_frame(self) -> wire.Ack:
        blocks = tuple((start, end) for start, end in self._ranges[: self._max_sack_blocks])
        self._ack_now = False
        self._ack_deadline = None
        self._unacked_in_order = 0
        self.stats.acks_sent += 1
        return wire.Ack(self._rcv_next, blocks)

    def datagrams_to_send(self, now: float) -> list[bytes]:
        """Every datagram due now: retransmissions, new data within the window, ACK, PING.

        DATA frames due together share datagrams up to ``mtu`` bytes (a burst of small
        messages costs one seal and one send per datagram, not per message), and a due
        ACK rides in the last one when it fits.
        """
        out: list[bytes] = []
        for token in self._path_responses:
            # Answered at once, to the peer's current address (the adapter's choice).
            self.stats.path_responses_sent += 1
            out.append(self._packet([wire.push_frame(wire.PathResponse(token))], now))
        self._path_responses.clear()
        frames: list[bytes] = []
        room = self.config.mtu - wire.HEADER_SIZE - wire.TAG_SIZE
        used = 0

        def add(item: _Outgoing) -> None:
            nonlocal used
            size = wire.DATA_FRAME.size + len(item.payload)
            if frames and used + size > room:
                out.append(self._packet(frames, now))
                frames.clear()
                used = 0
            # Every frame of a packet gets the number the packet is sent with.
            frames.append(self._data_frame(item, now, self._next_pn))
            used += size

        for item in self._resend:
            if item.seq in self._inflight and not item.sacked:
                add(item)
                if item is self._probe:
                    self._probe_pn = item.pn
        self._resend.clear()
        self._probe = None
        unsent = self._unsent
        if unsent and unsent[0].seq < self._snd_una + self.config.window:
            # New data: add()'s work without a call per frame, and _data_frame's for a
            # first transmission (issue 14: a drain sends a window of notifies at a time).
            limit = self._snd_una + self.config.window
            inflight = self._inflight
            if self._sent_order is None:
                self._sent_order = deque()
            order = self._sent_order
            if self._rto_deadline is None:
                self._rto_deadline = now + self.rto.rto  # RFC 6298 §5.1
            data_frame = wire.DATA_FRAME
            pack = data_frame.pack
            base = self._snd_una
            count = 0
            while unsent and unsent[0].seq < limit:
                item = unsent.popleft()
                payload = item.payload
                size = data_frame.size + len(payload)
                if frames and used + size > room:
                    out.append(self._packet(frames, now))
                    frames.clear()
                    used = 0
                seq = item.seq
                inflight[seq] = item
                pn = self._next_pn  # every frame of a packet gets its number
                item.transmissions = 1
                item.sent_at = now
                item.pn = pn
                order.append((pn, item))
                frames.append(
                    pack(wire.DATA_TYPE, seq, base, item.frag_index, item.frag_count, len(payload))
                    + payload
                )
                used += size
                count += 1
            self.stats.data_sent += count
            self._arm_probe(now)  # RFC 8985 §7.2: the tail moved
        if self._unsent is not None and not self._unsent:
            self._unsent = None  # an idle connection holds no queue
        # An emptied dict keeps the table it grew to (224 bytes for one entry, 4.7 kB after
        # a window of 100); clear() gives it back, and costs nothing on a dict without one.
        for table in (self._inflight, self._messages, self._buffer):
            if not table:
                table.clear()
        if self._ack_now:
            ack = self._ack_frame()
            if frames and used + wire.ACK_FRAME.size + wire.BLOCK.size * len(ack.blocks) > room:
                out.append(self._packet(frames, now))
                frames.clear()
            frames.append(wire.push_frame(ack))
        if frames:
            out.append(self._packet(frames, now))
        probe, self._ping_now = self._ping_now and not self._inflight, False
        if (
            self.config.keepalive_interval > 0
            and self.state is ConnectionState.CONNECTED
            and (probe or (not out and now >= self._last_sent + self.config.keepalive_interval))
        ):
            self.stats.pings_sent += 1
            out.append(self._packet([wire.push_frame(wire.Ping())], now))
            if self._rto_deadline is None:
                # An unanswered PING counts like unacknowledged DATA (same timer, back-off
                # and max_retries), so an idle side notices a dead peer (docs/rudp.md §3).
                self._rto_deadline = now + self.rto.rto
        return out

    def next_event(self) -> Event | None:
        """Pop the oldest pending event, or None."""
        if not self._events:
            return None
        event = self._events.popleft()
        if not self._events:
            self._events = None  # an idle connection holds no queue
        return event

    def _emit(self, event: Event) -> None:
        if self._events is None:
            self._events = deque()
        self._events.append(event)


def _subtract(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted disjoint [start, end) runs ``a`` less the sorted disjoint runs ``b``."""
    result: list[tuple[int, int]] = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while start < end and k < len(b) and b[k][0] < end:
            if b[k][0] > start:
                result.append((start, b[k][0]))
            start = max(start, b[k][1])
            k += 1
        if start < end:
            result.append((start, end))
    return result


def _union(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted disjoint runs covering ``a`` and ``b`` (adjacent runs merged)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(a + b):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged
