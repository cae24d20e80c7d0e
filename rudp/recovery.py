"""Loss recovery of the sender (sans-IO, a part of :class:`~rudp.connection.RudpConnection`).

ACKs carry a cumulative point and SACK ranges (RFC 2018 semantics). A packet is declared
lost and sent again at once when ``reorder_threshold`` packets sent after it were
acknowledged (fast retransmit, RFC 5681 §3.2 / RFC 9002 §6.1.1); a lost tail is found by
a tail-loss probe (RFC 8985 §7) after 2 SRTT without progress. Each ACK costs O(SACK
blocks + what it newly acknowledges), never O(window) (docs/rudp.md §3). One
retransmission timer runs as in RFC 6298 §5; each expiry backs the RTO off and resends
the oldest unacknowledged packet; expiry number ``max_retries + 1`` without progress
fails every pending message, in order, and the connection becomes DISCONNECTED. A
message counts as delivered only when the cumulative ACK passes its last fragment.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from rudp import packet as wire
from rudp.events import MessageAcked, MessageFailed, PeerDisconnected, PeerRestarted
from rudp.fields import MAX_U32, ConnectionFields, Outgoing

# What _detect_losses walks when nothing is in flight (never appended to).
_NO_ORDER: deque[tuple[int, Outgoing]] = deque()


class LossRecovery(ConnectionFields):
    """The connection's ACK processing, loss detection, probes, RTO and failure."""

    __slots__ = ()

    def _on_ack(self, ack: wire.Ack, now: float, *, newest: bool) -> None:
        progress = False
        sample: Outgoing | None = None
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
                self._resend = [o for o in self._resend if o.seq >= self._snd_una] or None
            if self._sacked_ranges:
                self._sacked_ranges = _subtract(self._sacked_ranges, [(0, self._snd_una)]) or ()
            # The pending ids are always the newest len(messages) ones (acks remove the
            # oldest, a failure all): the oldest is known without iterating the dict,
            # whose deleted head entries a next(iter()) would walk again on every call.
            messages = self._messages
            first = self._next_message_id - len(messages)
            if messages and messages[first][0] < self._snd_una:
                start = first
                while messages and messages[first][0] < self._snd_una:
                    del messages[first]
                    first += 1
                # One event for the run: the adapter completes its waiters up to the last.
                self._emit(MessageAcked(start, first - start))
        # Only in-flight sequence numbers matter: bounds the work one ACK can cause.
        blocks: list[tuple[int, int]] = []
        if ack.blocks:
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
            resend = self._resend or []
            for start, end in reneged:
                for seq in range(start, end):
                    out = self._inflight.get(seq)
                    if out is not None and out.sacked:
                        out.sacked = False
                        resend.append(out)
                        self.stats.fast_retransmissions += 1
            if reneged:
                self._sacked_ranges = _subtract(self._sacked_ranges, reneged) or ()
                if resend:
                    resend.sort(key=lambda o: o.seq)
                    self._resend = resend
        # What this ACK newly reports (the usual ACK, in order, reports no block).
        fresh = _subtract(blocks, self._sacked_ranges) if blocks else blocks
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
        lost: list[Outgoing] = []
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
                if self._parked is None:
                    self._parked = []
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
        if parked is not None and not parked:
            self._parked = None
        if lost:
            resend = self._resend or []
            queued = {o.seq for o in resend}
            for out in lost:
                if out.seq not in queued:
                    resend.append(out)
                    self.stats.fast_retransmissions += 1
            resend.sort(key=lambda o: o.seq)
            self._resend = resend

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
        if self._resend is None:
            self._resend = [out]
        elif all(o is not out for o in self._resend):
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
        self._resend = [o for i, o in enumerate(pending) if i == 0 or not o.sacked] or None
        if self._resend:
            first = self._resend[0]
            first.sacked = False
            self._sacked_ranges = _subtract(self._sacked_ranges, [(first.seq, first.seq + 1)]) or ()
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
        self._resend = None
        self._sacked_ranges = ()
        self._sent_order = None
        self._parked = None
        self._probe = None
        self._snd_una = self._next_seq  # abandoned; DATA's base tells the receiver
        self._rto_deadline = None
        self._pto_deadline = None
        self._loss_deadline = None
        self._emit(PeerDisconnected(failed))
        if self._restarted is not None:
            self._emit(PeerRestarted(self._restarted))
            self._restarted = None


def _subtract(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
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


def _union(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted disjoint runs covering ``a`` and ``b`` (adjacent runs merged)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted([*a, *b]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged
