"""Accepting TCP and TLS connections under :class:`sip.admission.Admission` (glue).

asyncio's own server with ``ssl=`` calls ``connection_made`` only after the handshake,
and gives every connection a 256 KiB TLS read buffer from the accept. So the listening
socket is read here: each accepted socket is counted by the policy at once (refused ones
closed at once), a TLS socket waits with no TLS state until its first bytes arrive, and
only then does asyncio wrap it (``connect_accepted_socket`` with a handshake timeout).
The policy's deadlines run on one timer for all connections.
"""

from __future__ import annotations

import asyncio
import errno
import math
import socket
import ssl
from collections import Counter
from collections.abc import Callable
from functools import partial

from sip.admission import Admission, AdmissionLimits, Phase, Refuse

# Connections accepted per wake: enough to drain a burst, few enough that the loop turns.
ACCEPT_BATCH = 64
# Out of descriptors: stop accepting for this long (the kernel keeps the backlog).
ACCEPT_PAUSE = 1.0
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}

Closer = Callable[[Phase], None]


class Gate:
    """One admission policy shared by a host's TCP and TLS listeners, its single
    deadline timer, and how to close each connection it admitted."""

    def __init__(self, limits: AdmissionLimits) -> None:
        self.policy = Admission(limits)
        self._closers: dict[int, Closer] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.refused = 0
        self.evicted = 0
        self.handshake_failures = 0
        self.expired: Counter[Phase] = Counter()
        # High-water marks since start, for metrics: what the caps held at worst.
        self.peak_total = 0
        self.peak_pending = 0
        self.peak_source = 0

    def admit(self, host: str, *, tls: bool) -> int | None:
        """The policy's id for a connection just accepted from ``host``, or None."""
        decision = self.policy.admit(host, _now(), tls=tls)
        if isinstance(decision, Refuse):
            self.refused += 1
            return None
        for victim in decision.evicted:
            self.evicted += 1
            self._close(victim, Phase.REQUEST)
        policy = self.policy
        self.peak_total = max(self.peak_total, policy.total)
        self.peak_pending = max(self.peak_pending, policy.pending)
        self.peak_source = max(self.peak_source, policy.count(decision.source))
        self._arm()
        return decision.conn

    def bind(self, conn: int, closer: Closer) -> None:
        """How to close ``conn`` from now on."""
        if self.policy.phase(conn) is None:
            closer(Phase.REQUEST)  # expired while changing hands
            return
        self._closers[conn] = closer

    def handshake_done(self, conn: int) -> None:
        self.policy.handshake_done(conn, _now())
        self._arm()

    def message_seen(self, conn: int) -> None:
        self.policy.message_seen(conn, _now())

    def activity(self, conn: int) -> None:
        self.policy.activity(conn, _now())

    def release(self, conn: int) -> None:
        self.policy.release(conn)
        self._closers.pop(conn, None)

    def close_all(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        for conn in list(self._closers):
            self.policy.release(conn)
            self._close(conn, Phase.ESTABLISHED)

    def _close(self, conn: int, phase: Phase) -> None:
        closer = self._closers.pop(conn, None)
        if closer is not None:
            closer(phase)

    def _arm(self) -> None:
        when = self.policy.next_deadline()
        if when is None or when >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        # The loop may run a timer a clock tick early: the armed time is the floor.
        now = max(_now(), self._timer_at)
        self._timer, self._timer_at = None, math.inf
        for expired in self.policy.expire(now):
            self.expired[expired.phase] += 1
            self._close(expired.conn, expired.phase)
        self._arm()


def _now() -> float:
    return asyncio.get_running_loop().time()


def listen_socket(host: str, port: int, backlog: int = 512) -> socket.socket:
    """A non-blocking listening TCP socket on ``host``:``port`` (SO_REUSEADDR; an IPv6
    one is IPv6 only, as asyncio's servers are)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class StreamListener:
    """Accepts on one listening socket; every connection passes the gate first.
    ``factory(conn)`` makes the protocol of admitted connection ``conn``."""

    def __init__(
        self,
        sock: socket.socket,
        gate: Gate,
        factory: Callable[[int], asyncio.Protocol],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.sock = sock
        self.gate = gate
        self.factory = factory
        self.tls = tls
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[None]] = set()
        self.accept_errors = 0
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._accept)

    @property
    def local(self) -> tuple[str, int]:
        name = self.sock.getsockname()
        return (str(name[0]), int(name[1]))

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn_sock, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.accept_errors += 1
                if exc.errno in _OUT_OF_RESOURCES:
                    self.loop.remove_reader(self.sock.fileno())
                    self.loop.call_later(ACCEPT_PAUSE, self._resume)
                    return
                continue  # ECONNABORTED and the like: that connection only
            conn = self.gate.admit(str(addr[0]), tls=self.tls is not None)
            if conn is None:
                conn_sock.close()
                continue
            conn_sock.setblocking(False)
            if self.tls is None:
                self._start(conn, conn_sock)
            else:
                # No TLS state (and no buffer) until the client says something.
                fd = conn_sock.fileno()
                self.loop.add_reader(fd, self._hello, conn, conn_sock)
                self.gate.bind(conn, partial(self._drop_waiting, fd, conn_sock))

    def _resume(self) -> None:
        if self.sock.fileno() >= 0:
            self.loop.add_reader(self.sock.fileno(), self._accept)

    def _drop_waiting(self, fd: int, sock: socket.socket, _phase: Phase) -> None:
        self.loop.remove_reader(fd)
        sock.close()

    def _hello(self, conn: int, sock: socket.socket) -> None:
        self.loop.remove_reader(sock.fileno())
        self._start(conn, sock)

    def _start(self, conn: int, sock: socket.socket) -> None:
        started = [False]
        task = self.loop.create_task(self._wrap(conn, sock, started))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

        def cancel(_phase: Phase) -> None:
            task.cancel()
            if not started[0]:  # a task cancelled before its first step never runs
                sock.close()

        self.gate.bind(conn, cancel)

    async def _wrap(self, conn: int, sock: socket.socket, started: list[bool]) -> None:
        started[0] = True
        try:
            await self.loop.connect_accepted_socket(
                partial(self.factory, conn),
                sock,
                ssl=self.tls,
                ssl_handshake_timeout=(
                    self.gate.policy.limits.handshake_timeout if self.tls else None
                ),
            )
        except OSError:  # TLS errors and the handshake timeout included
            self.gate.handshake_failures += 1
            self.gate.release(conn)
        except asyncio.CancelledError:
            self.gate.release(conn)
            raise

    async def close(self) -> None:
        """Stop accepting; cancel handshakes in progress."""
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
