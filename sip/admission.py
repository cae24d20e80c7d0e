"""Admission of accepted TCP and TLS connections, sans-IO: a clock and events in,
decisions out.

A connection is counted the moment it is accepted, before any TLS handshake, so one
that never sends a ClientHello holds a slot like any other. Three bounds apply:

- ``max_connections`` in total, every phase included;
- ``max_per_source``: a share of that total per source (an IPv4 address, or the
  ``ipv6_prefix`` network of an IPv6 address, since one IPv6 host owns a whole /64),
  so one address cannot take the global cap;
- ``max_pending``: connections that have not yet sent a full message (still in the TLS
  handshake, or waiting for their first request). When the total or the pending count
  is full, a newcomer displaces the oldest pending connection of the source holding the
  most pending connections, if that source holds more than the newcomer's own source.
  A flood from few addresses then cannot keep a fresh source out, and a flood from many
  turns the pending slots over oldest first instead of freezing them.

A connection lives in one of three phases, each with its own deadline:

- ``HANDSHAKE`` (TLS only): ``handshake_timeout`` from the accept, ClientHello included;
- ``REQUEST``: ``request_timeout`` (at most ``idle_timeout``) from the end of the
  handshake, or from the accept over TCP; bytes that do not make a full message do not
  move it, so a slow trickle cannot hold a slot;
- ``ESTABLISHED``: after its first full message, ``idle_timeout`` since its last bytes.

:class:`Admission` owns the counts and the deadlines; the asyncio glue
(``sip/aio/listener.py``) closes what it is told to.
"""

from __future__ import annotations

import heapq
import ipaddress
from dataclasses import dataclass
from enum import Enum


class Phase(Enum):
    HANDSHAKE = "handshake"
    REQUEST = "request"
    ESTABLISHED = "established"


@dataclass(frozen=True, kw_only=True, slots=True)
class AdmissionLimits:
    """Bounds on accepted stream connections (see the module docstring)."""

    max_connections: int = 256
    max_per_source: int = 32
    max_pending: int = 64
    handshake_timeout: float = 5.0
    request_timeout: float = 10.0
    idle_timeout: float = 300.0
    ipv6_prefix: int = 64

    @property
    def share(self) -> int:
        """Connections one source may hold at once."""
        return max(1, min(self.max_per_source, self.max_connections))

    @property
    def pending_cap(self) -> int:
        """Connections without a full message yet, in total."""
        return max(1, min(self.max_pending, self.max_connections))

    @property
    def first_request_timeout(self) -> float:
        """Never longer than the idle timeout of an established connection."""
        return min(self.request_timeout, self.idle_timeout)


@dataclass(frozen=True, slots=True)
class Admit:
    """Accept the connection as ``conn``; close the ``evicted`` ones first."""

    conn: int
    source: str
    evicted: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Refuse:
    """Close the connection at once. ``reason``: ``source-share``, ``total``, ``pending``."""

    source: str
    reason: str


@dataclass(frozen=True, slots=True)
class Expired:
    """A connection past its deadline: close it (the policy has forgotten it)."""

    conn: int
    phase: Phase


def source_of(host: str, ipv6_prefix: int = 64) -> str:
    """The key a connection from ``host`` is counted under: the IPv4 address, or the
    IPv6 network of ``ipv6_prefix`` bits (an IPv4-mapped IPv6 address counts as IPv4)."""
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        net = ipaddress.IPv6Network((addr, ipv6_prefix), strict=False)
        return str(net)
    return str(addr)


@dataclass(slots=True)
class _Conn:
    source: str
    phase: Phase
    deadline: float
    queued: float  # the deadline of this connection's live entry in the heap


class Admission:
    """Counts per source and in total, phases and deadlines of accepted connections."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        self._conns: dict[int, _Conn] = {}
        self._per_source: dict[str, int] = {}
        # Pending connections per source, oldest first (ids grow with time).
        self._pending: dict[str, dict[int, None]] = {}
        self._pending_total = 0
        self._heap: list[tuple[float, int]] = []
        self._next_id = 0

    # ------------------------------------------------------------------ queries

    @property
    def total(self) -> int:
        """Connections admitted and not yet released."""
        return len(self._conns)

    @property
    def pending(self) -> int:
        """Connections without a full message yet."""
        return self._pending_total

    def count(self, source: str) -> int:
        """Connections held by ``source`` (a key from :func:`source_of`)."""
        return self._per_source.get(source, 0)

    def pending_of(self, source: str) -> int:
        return len(self._pending.get(source, ()))

    def phase(self, conn: int) -> Phase | None:
        c = self._conns.get(conn)
        return None if c is None else c.phase

    def sources(self) -> dict[str, int]:
        """Connections per source, for metrics and tests."""
        return dict(self._per_source)

    @property
    def scheduled(self) -> int:
        """Deadline entries held, stale ones included: bounded by the live count."""
        return len(self._heap)

    def next_deadline(self) -> float | None:
        """When :meth:`expire` may next have something to return."""
        heap = self._heap
        while heap and self._stale(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # ------------------------------------------------------------------ events

    def admit(self, host: str, now: float, *, tls: bool) -> Admit | Refuse:
        """A connection from ``host`` was just accepted."""
        limits = self.limits
        source = source_of(host, limits.ipv6_prefix)
        if self.count(source) >= limits.share:
            return Refuse(source, "source-share")
        evicted: tuple[int, ...] = ()
        full_total = len(self._conns) >= limits.max_connections
        if full_total or self._pending_total >= limits.pending_cap:
            victim = self._victim(source)
            if victim is None:
                return Refuse(source, "total" if full_total else "pending")
            self._drop(victim)
            evicted = (victim,)
        conn = self._next_id
        self._next_id += 1
        timeout = limits.handshake_timeout if tls else limits.first_request_timeout
        deadline = now + timeout
        self._conns[conn] = _Conn(
            source, Phase.HANDSHAKE if tls else Phase.REQUEST, deadline, deadline
        )
        heapq.heappush(self._heap, (deadline, conn))
        self._per_source[source] = self._per_source.get(source, 0) + 1
        self._pending.setdefault(source, {})[conn] = None
        self._pending_total += 1
        return Admit(conn, source, evicted)

    def handshake_done(self, conn: int, now: float) -> None:
        """The TLS handshake of ``conn`` completed: it now has to send a request."""
        c = self._conns.get(conn)
        if c is None or c.phase is not Phase.HANDSHAKE:
            return
        c.phase = Phase.REQUEST
        c.deadline = now + self.limits.first_request_timeout
        self._requeue(conn, c)

    def message_seen(self, conn: int, now: float) -> None:
        """A full, well-formed message arrived on ``conn``."""
        c = self._conns.get(conn)
        if c is None:
            return
        if c.phase is not Phase.ESTABLISHED:
            c.phase = Phase.ESTABLISHED
            self._unpend(conn, c.source)
        c.deadline = now + self.limits.idle_timeout
        self._requeue(conn, c)

    def activity(self, conn: int, now: float) -> None:
        """Bytes arrived on ``conn``: an established connection is not idle."""
        c = self._conns.get(conn)
        if c is not None and c.phase is Phase.ESTABLISHED:
            c.deadline = now + self.limits.idle_timeout

    def release(self, conn: int) -> None:
        """``conn`` closed, whatever the reason; unknown ids are ignored."""
        if conn in self._conns:
            self._drop(conn)

    def expire(self, now: float) -> list[Expired]:
        """The connections past their deadline at ``now``, forgotten here."""
        out: list[Expired] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._stale(entry):
                continue
            conn = entry[1]
            c = self._conns[conn]
            if c.deadline > now:  # moved on by activity: queue it at its new deadline
                c.queued = c.deadline
                heapq.heappush(heap, (c.deadline, conn))
                continue
            out.append(Expired(conn, c.phase))
            self._drop(conn)
        return out

    # ------------------------------------------------------------------ inside

    def _stale(self, entry: tuple[float, int]) -> bool:
        c = self._conns.get(entry[1])
        return c is None or c.queued != entry[0]

    def _requeue(self, conn: int, c: _Conn) -> None:
        # A later deadline waits for its old entry to come up; an earlier one needs its own.
        if c.deadline < c.queued:
            c.queued = c.deadline
            heapq.heappush(self._heap, (c.deadline, conn))

    def _victim(self, source: str) -> int | None:
        """The oldest pending connection of the source with the most pending ones, if
        that source holds more than ``source`` does."""
        own = self.pending_of(source)
        best: tuple[int, int] | None = None  # (-count, oldest id)
        for src, conns in self._pending.items():
            if src == source or len(conns) <= own:
                continue
            key = (-len(conns), next(iter(conns)))
            if best is None or key < best:
                best = key
        return None if best is None else best[1]

    def _unpend(self, conn: int, source: str) -> None:
        conns = self._pending.get(source)
        if conns is not None and conn in conns:
            del conns[conn]
            self._pending_total -= 1
            if not conns:
                del self._pending[source]

    def _drop(self, conn: int) -> None:
        c = self._conns.pop(conn)
        self._unpend(conn, c.source)
        left = self._per_source[c.source] - 1
        if left:
            self._per_source[c.source] = left
        else:
            del self._per_source[c.source]
        # Entries of closed connections wait in the heap for their deadline; rebuild it
        # when they outnumber the live ones, so short connections cannot grow it.
        if len(self._heap) > 2 * len(self._conns) + 64:
            self._heap = [(c.queued, i) for i, c in self._conns.items()]
            heapq.heapify(self._heap)
