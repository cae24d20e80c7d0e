"""The receive window (sans-IO, a part of :class:`~rudp.connection.RudpConnection`).

Packets below the cumulative point or already buffered are duplicates; packets beyond
the window are dropped; the rest wait in a reordering buffer and leave in order into
reassembly. ACKs are delayed (``ack_delay``/``ack_every``) except for packets that open
or fill a hole and duplicates, which are acknowledged at once (RFC 5681 §4.2, RFC 9000
§13.2.1); the SACK runs are kept up to date per packet. DATA carries the sender's
``base``: sequence numbers below it were abandoned by a failed send and are skipped, so
the stream resumes after ``reset()`` without a hole. Each packet number is checked
against a sliding replay window.

Memory: the reordering buffer holds at most ``window`` packets of at most one payload
each, reassembly at most one message; ``max_buffer_bytes`` caps both together (an
in-order packet evicts out-of-order ones, which the sender resends, so the cap cannot
deadlock the stream).
"""

from __future__ import annotations

import bisect

from rudp import packet as wire
from rudp.events import MessageReceived
from rudp.fields import NO_ENTRIES, ConnectionFields, Reassembly


class ReceiveWindow(ConnectionFields):
    """The connection's replay window, reordering buffer, reassembly and ACKs."""

    __slots__ = ()

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes held for the peer: reordering buffer plus partial reassembly."""
        partial = self._partial
        return self._buffer_bytes + (0 if partial is None else partial.size)

    def _check_replay(self, pn: int) -> bool | None:
        """None: replay; True: newest so far; False: older but not seen (reordered)."""
        if pn > self._highest_pn:
            return True
        offset = self._highest_pn - pn
        if offset >= self.config.replay_window or not (self._pn_missing >> offset) & 1:
            return None
        return False

    def _commit_replay(self, pn: int) -> None:
        """Record ``pn`` as seen. The window keeps the numbers *not* seen yet (bit k: the
        newest minus k): on an idle path that loses nothing it stays 0, where a bitmap of
        those seen would hold ``replay_window`` bits of ones per connection."""
        window = self.config.replay_window
        offset = self._highest_pn - pn
        if offset < 0:  # the newest: the numbers skipped on the way may still arrive
            shift = -offset
            if shift >= window:
                self._pn_missing = (1 << window) - 2  # the whole window, bounded shift
            else:
                skipped = ((1 << (shift - 1)) - 1) << 1
                missing = (self._pn_missing << shift) | skipped
                if missing >> window:  # bits slid out: drop them (in order: 0, nothing to do)
                    missing &= (1 << window) - 1
                self._pn_missing = missing
            self._highest_pn = pn
        elif offset < window:
            self._pn_missing &= ~(1 << offset)

    def _data_ok(self, d: wire.Data) -> bool:
        """False (counted in ``bad_fragment``) when a DATA frame's fields are absurd."""
        return not (
            d.frag_count == 0
            or d.frag_index >= d.frag_count
            or d.frag_count > self._sizes.max_fragments
            or len(d.payload) > self._sizes.payload
            or d.base > d.seq
        )

    def _on_data(self, d: wire.Data, now: float) -> None:
        """Take one (checked) DATA frame."""
        if d.base > self._rcv_next:
            # The sender abandoned [rcv_next, base) after a failure: skip it (module doc).
            self.stats.skipped += d.base - self._rcv_next
            for seq in [s for s in self._buffer if s < d.base]:
                self._buffer_bytes -= len(self._buffer.pop(seq).payload)
            self._partial = None
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
        if self._buffer is NO_ENTRIES:
            self._buffer = {}
        self._buffer[d.seq] = d
        self._buffer_bytes += len(d.payload)
        if d.seq != self._rcv_next:
            if self._add_to_ranges(d.seq):
                self._ack_now = True  # a new hole, or one filled: tell the sender at once
            else:
                self._unacked_in_order += 1  # more above the same hole: ACK every ack_every
        elif self._ranges and self._ranges[0][0] == d.seq + 1:
            del self._ranges[0]  # the run after the hole leaves with this packet
            if not self._ranges:
                self._ranges = None
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
        if ranges is None:
            self._ranges = [[seq, seq + 1]]
            return True
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
        ranges: list[list[int]] = []
        for seq in sorted(self._buffer):
            if ranges and ranges[-1][1] == seq:
                ranges[-1][1] = seq + 1
            else:
                ranges.append([seq, seq + 1])
        self._ranges = ranges or None

    def _reassemble(self, frag: wire.Data) -> None:
        partial = self._partial
        if frag.frag_count == 1 and partial is None:  # a whole message: the common case
            self.stats.messages_delivered += 1
            self._emit(MessageReceived(frag.payload))
            return
        if frag.frag_index == 0:
            if partial is not None:
                self.stats.bad_fragment += 1
            partial = self._partial = Reassembly(frag.frag_count)
        elif (
            partial is None
            or frag.frag_index != len(partial.fragments)
            or frag.frag_count != partial.count
        ):
            self.stats.bad_fragment += 1
            self._partial = None
            return
        partial.fragments.append(frag.payload)
        partial.size += len(frag.payload)
        if len(partial.fragments) == partial.count:
            self._partial = None
            self.stats.messages_delivered += 1
            self._emit(MessageReceived(b"".join(partial.fragments)))

    def _ack_frame(self) -> wire.Ack:
        ranges = self._ranges or ()
        blocks = tuple((start, end) for start, end in ranges[: self._sizes.max_sack_blocks])
        self._ack_now = False
        self._ack_deadline = None
        self._unacked_in_order = 0
        self.stats.acks_sent += 1
        return wire.Ack(self._rcv_next, blocks)
