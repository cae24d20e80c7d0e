"""Reassembly of concatenated SMS: any arrival order, duplicates dropped (pure).

Segments are grouped by (sender, source port, reference width, reference, total), as
TS 23.040 §9.2.3.24.1 asks. When every piece is there the buffer's integrity tag is
checked; a good buffer is :class:`Completed` once. Its pieces are then remembered for
``memory`` seconds, so a late copy of any of them is recognised as a :class:`Duplicate`
(the link acknowledges it again: the first ack may have been lost) instead of starting a
new buffer. A piece with the same reference that does *not* match is a new buffer that
reused the reference: the memory is forgotten and a new assembly starts. A buffer whose
tag does not match (pieces of two buffers mixed) is :class:`Corrupt` and dropped; the
sender's retransmission fills it again.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field

from mdeci.sms.codec import Segment, integrity_tag, tag_length

AssemblyKey = tuple[str, int, bool, int, int]
#: Checks a whole buffer from a sender: (frame, tag) if it is intact, else ``None``.
Verify = Callable[[str, bytes], tuple[bytes, bytes] | None]


@dataclass(frozen=True, slots=True)
class Completed:
    sender: str
    ref: int
    total: int
    frame: bytes
    tag: bytes


@dataclass(frozen=True, slots=True)
class Duplicate:
    sender: str
    ref: int
    total: int
    tag: bytes


@dataclass(frozen=True, slots=True)
class Corrupt:
    sender: str
    ref: int
    total: int


Outcome = Completed | Duplicate | Corrupt


@dataclass(slots=True)
class _Assembly:
    parts: dict[int, bytes] = field(default_factory=dict)
    expires: float = 0.0


@dataclass(frozen=True, slots=True)
class _Done:
    parts: tuple[bytes, ...]
    tag: bytes
    expires: float


class Reassembler:
    """Collects segments into buffers. ``key`` selects HMAC tags instead of CRC-32;
    ``verify`` replaces the tag check altogether (authenticated buffers, :mod:`mdeci.sms.auth`).

    ``timeout``: an incomplete buffer is dropped this long after its last new piece;
    ``memory``: how long a completed buffer's pieces are remembered as duplicates;
    ``max_assemblies``/``max_done``: memory bounds (the oldest go first).
    """

    def __init__(
        self,
        *,
        key: bytes | None = None,
        verify: Verify | None = None,
        timeout: float = 4 * 3600.0,
        memory: float = 6 * 3600.0,
        max_assemblies: int = 1024,
        max_done: int = 4096,
    ) -> None:
        self._key = key
        self._verify = verify
        self._timeout = timeout
        self._memory = memory
        self._max_assemblies = max_assemblies
        self._max_done = max_done
        self._assemblies: dict[AssemblyKey, _Assembly] = {}
        self._done: dict[AssemblyKey, _Done] = {}
        self.dropped_incomplete = 0

    def __len__(self) -> int:
        """Incomplete buffers held."""
        return len(self._assemblies)

    def add(self, sender: str, seg: Segment, now: float) -> Outcome | None:
        """Take one segment; returns what it completed or proved, or ``None`` (pending)."""
        key: AssemblyKey = (sender, seg.src_port, seg.ref16, seg.ref, seg.total)
        done = self._done.get(key)
        if done is not None:
            if done.expires > now and done.parts[seg.seq - 1] == seg.data:
                return Duplicate(sender, seg.ref, seg.total, done.tag)
            del self._done[key]  # expired, or a new buffer reusing the reference
        asm = self._assemblies.get(key)
        if asm is None:
            while len(self._assemblies) >= self._max_assemblies:
                del self._assemblies[next(iter(self._assemblies))]
                self.dropped_incomplete += 1
            asm = self._assemblies[key] = _Assembly()
        if seg.seq in asm.parts:
            return None  # a copy of a piece we hold
        asm.parts[seg.seq] = seg.data
        asm.expires = now + self._timeout
        if len(asm.parts) < seg.total:
            return None
        del self._assemblies[key]
        parts = tuple(asm.parts[i] for i in range(1, seg.total + 1))
        opened = self._check(sender, b"".join(parts))
        if opened is None:
            return Corrupt(sender, seg.ref, seg.total)
        frame, tag = opened
        while len(self._done) >= self._max_done:
            del self._done[next(iter(self._done))]
        self._done[key] = _Done(parts, tag, now + self._memory)
        return Completed(sender, seg.ref, seg.total, frame, tag)

    def _check(self, sender: str, buffer: bytes) -> tuple[bytes, bytes] | None:
        if self._verify is not None:
            return self._verify(sender, buffer)
        tl = tag_length(self._key)
        tag, frame = buffer[:tl], buffer[tl:]
        if len(buffer) < tl or not hmac.compare_digest(tag, integrity_tag(frame, self._key)):
            return None
        return frame, tag

    def forget(self, sender: str, seg: Segment) -> None:
        """Forget the completed buffer ``seg`` belongs to: its copies complete it again."""
        self._done.pop((sender, seg.src_port, seg.ref16, seg.ref, seg.total), None)

    def expire(self, now: float) -> None:
        """Forget incomplete buffers and duplicate memory whose time has passed."""
        for key in [k for k, a in self._assemblies.items() if a.expires <= now]:
            del self._assemblies[key]
            self.dropped_incomplete += 1
        for key in [k for k, d in self._done.items() if d.expires <= now]:
            del self._done[key]

    def next_expiry(self) -> float | None:
        times = [a.expires for a in self._assemblies.values()]
        times += [d.expires for d in self._done.values()]
        return min(times, default=None)
