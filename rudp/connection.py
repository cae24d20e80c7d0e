"""The sans-IO RUDP connection: sender, receiver, fragmentation, authentication.

Theory of operation (aioquic style): the caller feeds ``receive_datagram(data, now,
source)``, ``handle_timer(now)`` and ``send_message(data, now)``, then pulls
``datagrams_to_send(now)``, ``path_challenge_to_send(now)``, ``get_timer()`` and
``next_event()``. Nothing here reads a clock, a socket or a random source; the random
sender id is injected.

Sender: a message is cut into fragments, one sequence number each. Up to ``window``
sequence numbers past the oldest unacknowledged one are in flight; DATA frames due
together share datagrams up to ``mtu`` bytes. What ACKs, timers and losses do to them is
``rudp.recovery``'s; the receiving half is ``rudp.receiver``'s, the peer's address and
its validation ``rudp.path``'s. They are parts of this one class (mixins over its slots),
as one connection is one object with one state.

Security: every datagram is encrypted and authenticated (AES-256-GCM, header as
associated data) under a key derived from the session secret and the sender id
(``rudp.packet.key_iv``), and carries a per-sender packet number checked
against a sliding replay window.
The peer's sender id is pinned by its first authenticated packet: a packet
with another sender id (our own: a reflection; any other: a replay from an
earlier connection under the same key) is dropped, so replays can neither
reset the replay window nor redirect the peer. Every dropped datagram is
counted in exactly one ``RudpStats`` field and never raised.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from rudp import packet as wire
from rudp.errors import MessageTooLarge, PacketError, PeerUnreachable
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
from rudp.fields import (
    MAX_U32,
    NO_ENTRIES,
    PN_LIMIT,
    ConnectionState,
    Event,
    Outgoing,
    derive_connection_id,
)
from rudp.path import Address, PathValidation
from rudp.receiver import ReceiveWindow
from rudp.recovery import LossRecovery

__all__ = [
    "ConnectionState",
    "Event",
    "MessageAcked",
    "MessageFailed",
    "MessageReceived",
    "PathChallenged",
    "PathValidated",
    "PeerDisconnected",
    "PeerRestarted",
    "RudpConnection",
    "RudpStats",
    "derive_connection_id",
]


class RudpConnection(LossRecovery, ReceiveWindow, PathValidation):
    """One RUDP association keyed by a session key (see module docstring)."""

    __slots__ = ()

    # ---------------------------------------------------------------- commands

    @property
    def connected(self) -> bool:
        return self.state is ConnectionState.CONNECTED

    @property
    def key(self) -> bytes:
        """The session key the connection was made with."""
        return self._key

    @property
    def payload_size(self) -> int:
        """Message bytes per DATA packet: ``mtu`` less header, DATA fields and tag."""
        return self._sizes.payload

    def send_message(self, data: bytes, now: float) -> int:
        """Queue ``data``; return its message id.

        Raises PeerUnreachable when DISCONNECTED, MessageTooLarge above max_message_size.
        """
        if self.state is ConnectionState.DISCONNECTED:
            raise PeerUnreachable("peer is disconnected; call reset()", data)
        if len(data) > self.config.max_message_size:
            raise MessageTooLarge(f"{len(data)} > {self.config.max_message_size} bytes")
        exhausted = self.stats.packets_sent > PN_LIMIT  # the next packet number
        if self._next_seq + self._sizes.max_fragments > MAX_U32 or exhausted:
            raise PeerUnreachable("sequence space exhausted; re-key the session", data)
        message_id = self._next_message_id
        self._next_message_id += 1
        size = self._sizes.payload
        if self._unsent is None:
            self._unsent = deque()
        seq = self._next_seq
        if len(data) <= size:  # one fragment, the usual case: no slicing, no loop
            self._unsent.append(Outgoing(seq, message_id, 0, 1, data))
        else:
            count = -(-len(data) // size)
            for index in range(count):
                self._unsent.append(
                    Outgoing(
                        seq + index,
                        message_id,
                        index,
                        count,
                        data[index * size : (index + 1) * size],
                    )
                )
            seq += count - 1
        self._next_seq = seq + 1
        if self._messages is NO_ENTRIES:
            self._messages = {}
        self._messages[message_id] = (seq, data)
        self.stats.messages_sent += 1
        return message_id

    def send_messages(self, messages: Sequence[bytes], now: float) -> list[int]:
        """:meth:`send_message` for each of ``messages``, in order; their ids. All or none:
        MessageTooLarge and PeerUnreachable (DISCONNECTED) are raised before the first is
        queued; only an exhausted sequence space midway leaves the first ones queued."""
        limit = self.config.max_message_size
        for data in messages:
            if len(data) > limit:
                raise MessageTooLarge(f"{len(data)} > {limit} bytes")
        return [self.send_message(data, now) for data in messages]

    def is_pending(self, message_id: int) -> bool:
        """Whether message ``message_id`` is neither acknowledged nor failed yet."""
        return message_id in self._messages

    def reset(self, now: float) -> None:
        """Leave DISCONNECTED: forget the failure and the RTT history so sending resumes."""
        self._transition("reset")
        self._retries = 0
        self.rto.clear()

    def announce(self) -> None:
        """Send a PING with the next datagrams, keepalive or not, unless data is in flight
        (it speaks for us): a new association makes itself known to a peer that holds the
        key but not our sender id (a restarted broker reaches its agents so)."""
        if self.state is ConnectionState.CONNECTED:
            self._ping_now = True
            if self._peer_sender is None and not self._spoke_first:
                self._spoke_first = True

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
        self._resend = (
            sorted((o for o in self._inflight.values() if not o.sacked), key=lambda o: o.seq)
            or None
        )
        self._rto_deadline = now + self.rto.rto if self._inflight else None
        self._waiting_since = now
        if self._peer_sender is not None:
            self._ack_now = True

    # ---------------------------------------------------------------- input

    def receive_datagram(self, data: bytes, now: float, source: Address | None = None) -> bool:
        """Process one datagram received from ``source``. Return True when it authenticated
        and is the newest seen.

        Such a datagram from another address than :attr:`peer_address` starts a path
        validation (``rudp.path``); a replayed old packet starts none. With ``source``
        None, addresses are not tracked. Never raises: a dropped datagram is counted in
        one ``stats`` field.
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
        payload = wire.unprotect(self._key_iv_of(header.sender), self._send_aead, data, header.pn)
        if payload is None:
            self.stats.bad_tag += 1
            return False
        if header.sender == self.sender_id:
            self.stats.reflected += 1
            return False
        if self._peer_sender is not None and header.sender != self._peer_sender:
            # Not the incarnation we talk to: a replay from an earlier connection under
            # this key, or the peer restarted with our key restored. Accepting it would
            # reset the replay window (module docstring): the layer above decides.
            self.stats.unknown_sender += 1
            self._on_other_incarnation(header.sender)
            return False
        fresh = self._check_replay(header.pn)
        if fresh is None:
            self.stats.replayed += 1
            return False
        if self._restarted is not None:  # the pinned peer speaks: not its successor
            self._restarted = None
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
        if (
            self._peer_sender is None
            and self._spoke_first
            and not any(isinstance(frame, wire.Data) for frame in frames)
        ):
            # We announced ourselves (a restarted broker's restored association): a
            # packet without DATA may be the keepalive of the peer's association with
            # our previous incarnation, which refuses all we send. Pinning its sender
            # would refuse the association the peer opens with us next; DATA pins.
            self.stats.unknown_sender += 1
            return False
        for frame in frames:
            if isinstance(frame, wire.Data):
                self._on_data(frame, now)
            elif isinstance(frame, wire.Ack):
                self._on_ack(frame, now, newest=fresh)
            elif isinstance(frame, wire.Ping):
                self._ack_now = True
            elif isinstance(frame, wire.PathChallenge):
                self._challenged(frame.token)
            else:
                self._on_path_response(frame.token, source, now)
        self._commit_replay(header.pn)
        self._peer_sender = header.sender
        self.stats.packets_received += 1
        if self._rto_deadline is not None and not self._inflight:
            # Only a keepalive probe was outstanding, and the peer is alive.
            self._rto_deadline = None
            self._retries = 0
        # The peer is alive: dead_after counts from here while something waits (an idle
        # connection keeps no time of its own for it: a broker holds one per session).
        self._waiting_since = now if self._rto_deadline is not None else 0.0
        if fresh and source != self._peer_address and source is not None:
            self._on_new_source(source, now)
        return fresh

    def _key_iv_of(self, sender: int) -> int:
        if sender == self.sender_id:
            return self._send_key_iv  # a reflection authenticates; counted as such after
        if sender == self._peer_keys_of:
            return self._peer_key_iv
        # One HKDF per new sender id; the pinned peer's keys stay cached (the check
        # against the pinned id comes after authentication, in receive_datagram).
        protection = wire.Protection.AEAD if self._send_aead else wire.Protection.INTEGRITY_ONLY
        key_iv = wire.key_iv(self._key, sender, protection)
        if self._peer_sender is None or sender == self._peer_sender:
            self._peer_key_iv, self._peer_keys_of = key_iv, sender
        return key_iv

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
        dead_at = self._dead_at()
        if dead_at is not None:
            times.append(dead_at)
        return min(times) if times else None

    def _dead_at(self) -> float | None:
        """When the peer counts as dead: ``dead_after`` seconds of waiting for it (a PING
        or DATA unanswered) with nothing authentic heard; None when nothing waits."""
        if self.config.dead_after <= 0 or self._rto_deadline is None:
            return None
        return self._waiting_since + self.config.dead_after

    def _on_other_incarnation(self, sender: int) -> None:
        """An authentic datagram under our key from a sender that is not the pinned peer.
        Given up on the pinned one, report it (the peer may have restarted and restored
        our key); while it is still believed alive, probe it at once, so that a dead one
        is found out within ``dead_after`` rather than at the next keepalive, and keep the
        sender: giving the pinned one up then reports it at once (recovery ``_fail``),
        rather than at the new incarnation's next datagram, which its back-off may delay
        by seconds."""
        if self.state is ConnectionState.DISCONNECTED:
            self._emit(PeerRestarted(sender))
            return
        self._restarted = sender
        if not self._inflight and self._rto_deadline is None:
            self.announce()

    def handle_timer(self, now: float) -> None:
        dead_at = self._dead_at()
        if dead_at is not None and now >= dead_at:
            self.stats.timeouts += 1
            self._fail(now)
            return
        if self._ack_deadline is not None and now >= self._ack_deadline:
            self._ack_now = True
        if self._rto_deadline is not None and now >= self._rto_deadline:
            self._on_rto(now)
        elif self._loss_deadline is not None and now >= self._loss_deadline:
            self._detect_losses(now)  # RFC 9002 §6.2.1: the loss timer comes before the PTO
        elif self._pto_deadline is not None and now >= self._pto_deadline:
            self._on_probe_timeout()

    # ---------------------------------------------------------------- output

    def _packet(self, frames: list[bytes], now: float) -> bytes:
        """One datagram of encoded ``frames``, numbered with the next packet number."""
        stats = self.stats
        pn = stats.packets_sent  # the packets sent so far number the next one
        stats.packets_sent = pn + 1
        self._last_sent = now
        return wire.seal_encoded(
            self._send_key_iv, self._send_aead, self.cid, self.sender_id, pn, frames
        )

    def _data_frame(self, out: Outgoing, now: float, pn: int) -> bytes:
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
            self._waiting_since = now
        return wire.push_data(out.seq, self._snd_una, out.frag_index, out.frag_count, out.payload)

    def datagrams_to_send(self, now: float) -> list[bytes]:
        """Every datagram due now: retransmissions, new data within the window, ACK, PING.

        DATA frames due together share datagrams up to ``mtu`` bytes (a burst of small
        messages costs one seal and one send per datagram, not per message), and a due
        ACK rides in the last one when it fits.
        """
        out: list[bytes] = []
        if self._path is not None and (tokens := self._responses_due()) is not None:
            for token in tokens:
                # Answered at once, to the peer's current address (the adapter's choice).
                self.stats.path_responses_sent += 1
                out.append(self._packet([wire.push_frame(wire.PathResponse(token))], now))
        frames: list[bytes] = []
        room = self.config.mtu - wire.HEADER_SIZE - wire.TAG_SIZE
        used = 0

        def add(item: Outgoing) -> None:
            nonlocal used
            size = wire.DATA_FRAME.size + len(item.payload)
            if frames and used + size > room:
                out.append(self._packet(frames, now))
                frames.clear()
                used = 0
            # Every frame of a packet gets the number the packet is sent with.
            frames.append(self._data_frame(item, now, self.stats.packets_sent))
            used += size

        if self._resend is not None:
            for item in self._resend:
                if item.seq in self._inflight and not item.sacked:
                    add(item)
                    if item is self._probe:
                        self._probe_pn = item.pn
            self._resend = None
        self._probe = None
        unsent = self._unsent
        if unsent and unsent[0].seq < self._snd_una + self.config.window:
            # New data: add()'s work without a call per frame, and _data_frame's for a
            # first transmission (a broker's drain sends a window of notifies at a time).
            limit = self._snd_una + self.config.window
            if self._inflight is NO_ENTRIES:
                self._inflight = {}
            inflight = self._inflight
            if self._sent_order is None:
                self._sent_order = deque()
            order = self._sent_order
            if self._rto_deadline is None:
                self._rto_deadline = now + self.rto.rto  # RFC 6298 §5.1
                self._waiting_since = now
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
                pn = self.stats.packets_sent  # every frame of a packet gets its number
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
        # a window of 100): an idle connection gives its tables back.
        if not self._inflight:
            self._inflight = NO_ENTRIES
        if not self._messages:
            self._messages = NO_ENTRIES
        if not self._buffer:
            self._buffer = NO_ENTRIES
        if self._ack_now:
            ack = self._ack_frame()
            if frames and used + wire.ACK_FRAME.size + wire.BLOCK.size * len(ack.blocks) > room:
                out.append(self._packet(frames, now))
                frames.clear()
            frames.append(wire.push_frame(ack))
        if frames:
            out.append(self._packet(frames, now))
        probe, self._ping_now = self._ping_now and not self._inflight, False
        interval = self.config.keepalive_interval
        idle = interval > 0 and not out and now >= self._last_sent + interval
        if self.state is ConnectionState.CONNECTED and (probe or idle):
            self.stats.pings_sent += 1
            out.append(self._packet([wire.push_frame(wire.Ping())], now))
            if self._rto_deadline is None:
                # An unanswered PING counts like unacknowledged DATA (same timer, back-off
                # and max_retries), so an idle side notices a dead peer (docs/rudp.md §3).
                self._rto_deadline = now + self.rto.rto
                self._waiting_since = now
        return out

    def next_event(self) -> Event | None:
        """Pop the oldest pending event, or None."""
        if not self._events:
            return None
        event = self._events.popleft()
        if not self._events:
            self._events = None  # an idle connection holds no queue
        return event
