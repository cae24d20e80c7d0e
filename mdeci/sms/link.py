"""An acknowledged SMS link for frames (sans-IO): buffers, acks, doubling timeouts.

Theory of operation (after the NETBTL-style scheme the thesis describes). A frame is one
*buffer* (:mod:`mdeci.sms.codec`). With ``first_part_ack`` (the default) a buffer of
several segments is sent in two steps: first segment 1 alone, which the receiver
acknowledges with a *part ack* (an ack entry whose segment count is 0, carrying the tag's
first octets, which segment 1 holds); only then the rest. So an SMSC path that is slow
or dead costs one SMS per try, not the whole buffer. The receiver acknowledges the whole
buffer with one ack entry once it has reassembled it and checked its tag. The sender
waits ``ack_timeout`` (200 s by default: docs/benchmarks.md "SMS link timers"); on each
expiry it submits again what the current step needs (segment 1 before its part ack,
every segment after it) and doubles the wait (capped at ``ack_timeout_max``); the
receiver drops the copies it already holds. The part ack resets the wait to
``ack_timeout``: the path was just shown to work. When the buffer's TTL ends
unacknowledged, the sender reports :class:`BufferExpired` ("undeliverable"). A late
copy of a completed buffer is acknowledged again (the first ack may have been lost) but
not delivered again. Acks carry the reference, the segment count and the first four
octets of the buffer's tag, so an ack for an older buffer that used the same reference
is not taken for a newer one.

The link is a state machine with no I/O and no clock: the caller passes ``now``, sends
what :meth:`SmsLink.sms_to_send` returns through a gateway, feeds received SMS to
:meth:`SmsLink.receive_sms`, calls :meth:`SmsLink.handle_timer` at
:meth:`SmsLink.get_timer`, and reads :meth:`SmsLink.next_event`. Frames are opaque
bytes; exactly-once delivery to the application is the ``nseq`` gate's job
(:mod:`mdeci.sms.dedupe`), as over IP.

Authentication. With ``SmsConfig.authenticated`` the link takes an
:class:`~mdeci.sms.auth.SmsAuth` and every buffer and every ack SMS body is sealed
(AEAD, a counter per direction: :mod:`mdeci.sms.auth`). Then an SMS from a number with no
keys, a buffer or ack that fails authentication, and an authentic one whose counter was
accepted already (a replay) are each counted and reported by :meth:`SmsLink.next_refusal`
and change nothing: no frame, no ack taken. A replayed buffer is acknowledged again, as a
late copy is (the sender may still be resending it), but not delivered.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from mdeci.sms.auth import OVERHEAD, Kind, SmsAuth
from mdeci.sms.codec import (
    AckEntry,
    Sms,
    encode_acks,
    encode_frame,
    parse_acks,
    parse_segment,
    segments_needed,
    split,
)
from mdeci.sms.codec import ports as sms_ports
from mdeci.sms.config import SmsConfig
from mdeci.sms.errors import (
    AuthError,
    NoFreeReference,
    PduError,
    ReplayedFrame,
    SmsError,
    UnknownPeer,
)
from mdeci.sms.reassembly import Completed, Corrupt, Duplicate, Reassembler


@dataclass(frozen=True, slots=True)
class FrameReceived:
    """A frame arrived complete and intact from ``sender`` (it may be a repeat)."""

    sender: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class BufferAcknowledged:
    """The peer acknowledged buffer ``buffer_id``; ``sms_sent`` SMS it took in all."""

    buffer_id: int
    peer: str
    sms_sent: int
    sent_at: float
    acked_at: float


@dataclass(frozen=True, slots=True)
class BufferExpired:
    """Buffer ``buffer_id`` was not acknowledged within its TTL: undeliverable."""

    buffer_id: int
    peer: str
    sms_sent: int


LinkEvent = FrameReceived | BufferAcknowledged | BufferExpired


class Refusal(enum.Enum):
    """Why an SMS was refused by an authenticated link."""

    UNKNOWN_NUMBER = "unknown number"
    UNAUTHENTIC = "failed authentication"
    REPLAYED = "replayed"
    UNRECORDED = "counter not recorded"  # the caller's counter store failed


@dataclass(frozen=True, slots=True)
class SmsRefused:
    """An SMS from ``sender`` was dropped and changed nothing; ``what`` is buffer or ack."""

    sender: str
    reason: Refusal
    what: str


@dataclass(slots=True)
class LinkStats:
    """Counters of one link (for logs and tests)."""

    sms_sent: int = 0
    sms_received: int = 0
    acks_sent: int = 0
    acks_received: int = 0
    stale_acks: int = 0
    duplicates: int = 0
    corrupt: int = 0
    foreign: int = 0
    resends: int = 0
    unknown_number: int = 0
    unauthentic: int = 0
    replayed: int = 0
    unrecorded: int = 0


@dataclass(slots=True)
class _Pending:
    buffer_id: int
    peer: str
    ref: int
    pieces: list[tuple[bytes, bytes]]
    tag4: bytes
    sent_at: float
    deadline: float
    timeout: float
    next_resend: float
    sms_sent: int = 0
    first_acked: bool = True  # False while only segment 1 may be sent


@dataclass(slots=True)
class _PeerRefs:
    next_ref: int = 0
    in_use: dict[tuple[int, int], int] = field(default_factory=dict)  # (ref, total) -> id


class SmsLink:
    """Frames to and from other numbers over SMS, for the local number ``address``.

    ``auth`` is required with ``config.authenticated`` and refused without it.
    """

    def __init__(
        self, address: str, config: SmsConfig | None = None, *, auth: SmsAuth | None = None
    ) -> None:
        self.address = address
        self.config = config or SmsConfig()
        if self.config.authenticated != (auth is not None):
            raise SmsError("an SmsAuth goes with SmsConfig(authenticated=True), and only then")
        self.auth = auth
        self.stats = LinkStats()
        self._refusals: deque[SmsRefused] = deque()
        self._reasm = Reassembler(
            key=self.config.key,
            verify=None if auth is None else self._verify,
            timeout=self.config.reassembly_timeout,
            memory=self.config.duplicate_memory,
            max_assemblies=self.config.max_assemblies,
            max_done=self.config.max_done,
        )
        self._pending: dict[int, _Pending] = {}
        self._peers: dict[str, _PeerRefs] = {}
        self._next_id = 1
        self._out: list[Sms] = []
        self._acks: dict[str, list[AckEntry]] = {}
        self._events: deque[LinkEvent] = deque()

    # -- commands -------------------------------------------------------------------

    def send_frame(self, to: str, frame: bytes, now: float, *, ttl: float | None = None) -> int:
        """Queue ``frame`` for ``to``; returns the buffer id events will name.

        Raises :class:`~mdeci.sms.errors.FrameTooLarge` beyond 255 segments and
        :class:`~mdeci.sms.errors.NoFreeReference` if every reference to ``to`` is in use.
        Authenticated, it raises :class:`~mdeci.sms.errors.UnknownPeer` for a number with
        no keys.
        """
        cfg = self.config
        if self.auth is not None and not self.auth.knows(to):
            raise UnknownPeer(f"no SMS keys for {to}")
        refs = self._peers.setdefault(to, _PeerRefs())
        space = 1 << 16 if cfg.ref16 else 1 << 8
        total = segments_needed(len(frame), ref16=cfg.ref16, overhead=cfg.overhead)
        for _ in range(space):
            ref = refs.next_ref
            refs.next_ref = (refs.next_ref + 1) % space
            if (ref, total) not in refs.in_use:
                break
        else:
            raise NoFreeReference(f"all {space} references to {to} are in flight")
        if self.auth is None:
            pieces = encode_frame(
                frame,
                ref=ref,
                ref16=cfg.ref16,
                dst_port=cfg.data_port,
                src_port=cfg.data_port,
                key=cfg.key,
            )
        else:
            pieces = split(
                self.auth.seal(to, Kind.DATA, frame),
                ref=ref,
                ref16=cfg.ref16,
                dst_port=cfg.data_port,
                src_port=cfg.data_port,
            )
        buffer_id = self._next_id
        self._next_id += 1
        ttl = cfg.default_ttl if ttl is None else ttl
        pending = _Pending(
            buffer_id=buffer_id,
            peer=to,
            ref=ref,
            pieces=pieces,
            tag4=pieces[0][1][:4],
            sent_at=now,
            deadline=now + ttl,
            timeout=cfg.ack_timeout,
            next_resend=now + cfg.ack_timeout,
            first_acked=not (cfg.first_part_ack and len(pieces) > 1),
        )
        refs.in_use[(ref, total)] = buffer_id
        self._pending[buffer_id] = pending
        self._submit(pending)
        return buffer_id

    def cancel(self, buffer_id: int) -> bool:
        """Stop (re)sending a buffer, e.g. when IP delivered the frame; no event follows."""
        pending = self._pending.pop(buffer_id, None)
        if pending is None:
            return False
        del self._peers[pending.peer].in_use[(pending.ref, len(pending.pieces))]
        return True

    def pending(self) -> list[int]:
        """Ids of buffers still waiting for their ack."""
        return list(self._pending)

    # -- inputs ---------------------------------------------------------------------

    def receive_sms(self, sms: Sms, now: float) -> None:
        """Take one received SMS. Anything that is not an mdeci SMS is counted and dropped."""
        self.stats.sms_received += 1
        try:
            dst, _src = sms_ports(sms.udh)
            if dst not in (self.config.ack_port, self.config.data_port):
                self.stats.foreign += 1
            elif self.auth is not None and not self.auth.knows(sms.sender):
                what = "ack" if dst == self.config.ack_port else "buffer"
                self._refuse(sms.sender, Refusal.UNKNOWN_NUMBER, what)
            elif dst == self.config.ack_port:
                entries = self._open_acks(sms.sender, sms.body)
                if entries is not None:
                    self._on_acks(sms.sender, entries, now)
            else:
                self._on_segment(sms, now)
        except PduError:
            self.stats.foreign += 1

    def handle_timer(self, now: float) -> None:
        """Resend or expire buffers whose time has come; forget stale reassembly state."""
        for pending in list(self._pending.values()):
            if now >= pending.deadline:
                self.cancel(pending.buffer_id)
                self._events.append(
                    BufferExpired(pending.buffer_id, pending.peer, pending.sms_sent)
                )
            elif now >= pending.next_resend:
                self.stats.resends += 1
                pending.timeout = min(pending.timeout * 2, self.config.ack_timeout_max)
                pending.next_resend = now + pending.timeout
                self._submit(pending)
        self._reasm.expire(now)

    # -- outputs --------------------------------------------------------------------

    def get_timer(self) -> float | None:
        """When :meth:`handle_timer` should next be called, or ``None``."""
        times = [min(p.next_resend, p.deadline) for p in self._pending.values()]
        expiry = self._reasm.next_expiry()
        if expiry is not None:
            times.append(expiry)
        return min(times, default=None)

    def sms_to_send(self) -> list[Sms]:
        """SMS to submit now (segments and acks), in order; clears the list."""
        overhead = 0 if self.auth is None else OVERHEAD
        for peer, entries in self._acks.items():
            for udh, body in encode_acks(
                entries,
                dst_port=self.config.ack_port,
                src_port=self.config.data_port,
                overhead=overhead,
            ):
                if self.auth is not None:
                    try:
                        body = self.auth.seal(peer, Kind.ACK, body)
                    except SmsError:
                        # Its user went away, or the counter store failed: the
                        # sender's resend asks again.
                        continue
                self._out.append(Sms(self.address, peer, udh, body))
                self.stats.acks_sent += 1
        self._acks.clear()
        out, self._out = self._out, []
        self.stats.sms_sent += len(out)
        return out

    def next_event(self) -> LinkEvent | None:
        return self._events.popleft() if self._events else None

    def next_refusal(self) -> SmsRefused | None:
        """The next SMS an authenticated link refused (to log), or ``None``."""
        return self._refusals.popleft() if self._refusals else None

    # -- internals ------------------------------------------------------------------

    def _submit(self, pending: _Pending, *, rest_only: bool = False) -> None:
        if not pending.first_acked:
            pieces = pending.pieces[:1]
        elif rest_only:
            pieces = pending.pieces[1:]
        else:
            pieces = pending.pieces
        for udh, body in pieces:
            self._out.append(Sms(self.address, pending.peer, udh, body))
        pending.sms_sent += len(pieces)

    def _refuse(self, sender: str, reason: Refusal, what: str) -> None:
        if reason is Refusal.UNKNOWN_NUMBER:
            self.stats.unknown_number += 1
        elif reason is Refusal.UNAUTHENTIC:
            self.stats.unauthentic += 1
        elif reason is Refusal.REPLAYED:
            self.stats.replayed += 1
        else:
            self.stats.unrecorded += 1
        self._refusals.append(SmsRefused(sender, reason, what))

    def _verify(self, sender: str, buffer: bytes) -> tuple[bytes, bytes] | None:
        """The reassembler's check of a sealed buffer: the buffer itself, named by its tag."""
        assert self.auth is not None
        try:
            self.auth.open(sender, Kind.DATA, buffer)
        except (AuthError, UnknownPeer):
            return None
        return buffer, buffer[:4]

    def _open_acks(self, sender: str, body: bytes) -> list[AckEntry] | None:
        """The entries of an ack SMS, or ``None`` (refused) if it is not authentic and new."""
        if self.auth is None:
            return parse_acks(body)
        try:
            counter, plain = self.auth.open(sender, Kind.ACK, body)
            self.auth.accept(sender, counter)
        except AuthError:
            self._refuse(sender, Refusal.UNAUTHENTIC, "ack")
            return None
        except ReplayedFrame:
            self._refuse(sender, Refusal.REPLAYED, "ack")
            return None
        except SmsError:
            self._refuse(sender, Refusal.UNRECORDED, "ack")
            return None
        return parse_acks(plain)

    def _on_segment(self, sms: Sms, now: float) -> None:
        seg = parse_segment(sms.udh, sms.body)
        outcome = self._reasm.add(sms.sender, seg, now)
        if outcome is None:
            if seg.seq == 1 and seg.total > 1:
                # Part ack: segment 1 holds the buffer's tag, whose first octets name it.
                entry = AckEntry(seg.ref, 0, seg.data[:4])
                self._acks.setdefault(sms.sender, []).append(entry)
            return
        if isinstance(outcome, Corrupt):
            self.stats.corrupt += 1
            if self.auth is not None:
                self._refuse(sms.sender, Refusal.UNAUTHENTIC, "buffer")
            return
        acks = self._acks.setdefault(sms.sender, [])
        entry = AckEntry(outcome.ref, outcome.total, outcome.tag[:4])
        if isinstance(outcome, Duplicate):
            acks.append(entry)
            self.stats.duplicates += 1
            return
        assert isinstance(outcome, Completed)
        frame = outcome.frame
        if self.auth is not None:
            counter, frame = self.auth.open(sms.sender, Kind.DATA, outcome.frame)
            try:
                self.auth.accept(sms.sender, counter)
            except ReplayedFrame:
                acks.append(entry)  # the sender may still be resending it
                self._refuse(sms.sender, Refusal.REPLAYED, "buffer")
                return
            except SmsError:
                # Neither delivered nor acknowledged: the sender's resend tries again.
                self._reasm.forget(sms.sender, seg)
                self._refuse(sms.sender, Refusal.UNRECORDED, "buffer")
                return
        acks.append(entry)
        self._events.append(FrameReceived(outcome.sender, frame))

    def _on_acks(self, sender: str, entries: list[AckEntry], now: float) -> None:
        refs = self._peers.get(sender)
        for entry in entries:
            self.stats.acks_received += 1
            if entry.total == 0:
                self._on_part_ack(refs, entry, now)
                continue
            buffer_id = None if refs is None else refs.in_use.get((entry.ref, entry.total))
            pending = None if buffer_id is None else self._pending.get(buffer_id)
            if pending is None or pending.tag4 != entry.tag4:
                self.stats.stale_acks += 1
                continue
            self.cancel(pending.buffer_id)
            self._events.append(
                BufferAcknowledged(
                    pending.buffer_id, pending.peer, pending.sms_sent, pending.sent_at, now
                )
            )

    def _on_part_ack(self, refs: _PeerRefs | None, entry: AckEntry, now: float) -> None:
        """Segment 1 of a buffer got through: send the rest, waiting ``ack_timeout``."""
        if refs is not None:
            for (ref, _total), buffer_id in refs.in_use.items():
                pending = self._pending.get(buffer_id)
                if ref == entry.ref and pending is not None and pending.tag4 == entry.tag4:
                    if not pending.first_acked:
                        pending.first_acked = True
                        pending.timeout = self.config.ack_timeout
                        pending.next_resend = now + pending.timeout
                        self._submit(pending, rest_only=True)
                    return  # a repeated part ack: the rest is on its way already
        self.stats.stale_acks += 1
