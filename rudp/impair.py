"""User-space link impairment proxy (the kernel here has no netem).

Library: ``ImpairmentProxy(listen=..., forward=..., impairment=Impairment(...), seed=1)``
then ``await proxy.start()`` / ``await proxy.close()``. Command::

    python -m rudp.impair --listen 127.0.0.1:9000 --forward 127.0.0.1:9001 \\
        --loss 0.1 --dup 0.05 --reorder 0.05 --delay 20 --jitter 10 --rate 1mbit --seed 1

Options: --loss/--dup/--reorder are probabilities, --delay/--jitter milliseconds,
--rate a link rate (bit, kbit, mbit, gbit), --seed the RNG seed, --tcp relays TCP,
--socket-buffer sizes the UDP sockets' kernel buffers (the relay should not drop),
--max-clients bounds the UDP client addresses relayed (a device that moves often is a
new client at each address).

UDP (default): clients send to ``listen``; each client address gets its own
upstream socket towards ``forward``, so the server sees a distinct source per
client (a client that rebinds looks like a peer that moved). Replies travel
back impaired the same way. Every decision (loss, duplicate, reorder, delay)
comes from one ``random.Random(seed)`` per direction, so a given packet
sequence meets the same fate on every run. The relay must cost less per datagram than
what it measures: it reads every datagram waiting per wake, keeps its departures in one
heap behind one loop timer, and sends those due together to one place in one GSO write
(``rudp.gso``; ~3 µs a datagram on loopback, against ~40-65 µs before).

TCP (``protocol="tcp"``): a byte stream cannot lose, duplicate or reorder
bytes, so the proxy imposes what TCP would suffer from the same link: every
chunk is delayed by ``delay ± jitter`` (order kept); a chunk that the UDP link
would have lost is held back ``tcp_loss_penalty`` seconds (a retransmission:
Linux's minimum RTO is 200 ms), delaying everything behind it (head-of-line
blocking); duplicates cost nothing (the receiver drops them); ``rate`` limits
as for UDP. This is an approximation, not a packet-level TCP model.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import random
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from rudp import gso


@dataclass(frozen=True, kw_only=True, slots=True)
class Impairment:
    """What the link does to each packet. Probabilities in [0, 1]; times in seconds."""

    loss: float = 0.0  # probability a packet is dropped
    dup: float = 0.0  # probability a packet is delivered twice
    reorder: float = 0.0  # probability a packet is held back so later ones overtake it
    delay: float = 0.0  # one-way base delay
    jitter: float = 0.0  # uniform +- added to the delay
    rate: float | None = None  # link rate in bits/s (None = unlimited)
    reorder_extra: float = 0.01  # extra hold-back of a reordered packet (+ delay + jitter)
    queue_limit: int = 10_000  # packets waiting on a rate-limited link before tail drop
    socket_buffer: int = 4 << 20  # kernel buffers of the proxy's UDP sockets, so the relay
    # itself does not drop bursts (Linux caps it at net.core.rmem_max / wmem_max)
    tcp_loss_penalty: float = 0.2  # TCP mode: extra hold of a "lost" chunk


@dataclass(slots=True)
class DirectionStats:
    packets_in: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    packets_out: int = 0


@dataclass(slots=True)
class Link:
    """One direction of the link: decides each packet's fate from its own seeded RNG."""

    rng: random.Random
    impairment: Impairment
    stats: DirectionStats = field(default_factory=DirectionStats)
    link_free: float = 0.0
    last_departure: float = 0.0
    queued: int = 0

    def schedule(self, now: float, size: int) -> list[float]:
        """Departure times of one packet's copies (empty: dropped)."""
        imp = self.impairment
        self.stats.packets_in += 1
        # Draw every decision each time so the random stream stays aligned with packets.
        lost = self.rng.random() < imp.loss
        dup = self.rng.random() < imp.dup
        reorder = self.rng.random() < imp.reorder
        jitters = [self.rng.uniform(-imp.jitter, imp.jitter) for _ in range(2)]
        if lost:
            self.stats.dropped += 1
            return []
        start = now
        if imp.rate:
            if self.queued >= imp.queue_limit:
                self.stats.dropped += 1
                return []
            start = max(now, self.link_free) + size * 8 / imp.rate
            self.link_free = start
        times = [start + max(0.0, imp.delay + jitters[0])]
        if reorder:
            self.stats.reordered += 1
            times[0] += imp.delay + imp.jitter + imp.reorder_extra
        if dup:
            self.stats.duplicated += 1
            times.append(start + max(0.0, imp.delay + jitters[1]))
        return times

    def schedule_stream(self, now: float, size: int) -> float:
        """TCP mode: one departure time, never earlier than the previous chunk's."""
        imp = self.impairment
        self.stats.packets_in += 1
        lost = self.rng.random() < imp.loss
        jitter = self.rng.uniform(-imp.jitter, imp.jitter)
        start = now
        if imp.rate:
            start = max(now, self.link_free) + size * 8 / imp.rate
            self.link_free = start
        when = start + max(0.0, imp.delay + jitter)
        if lost:
            self.stats.dropped += 1
            when += imp.tcp_loss_penalty
        when = max(when, self.last_departure)
        self.last_departure = when
        return when


def _set_buffers(sock: socket.socket, size: int) -> None:
    if size <= 0:
        return
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, size)


# Datagrams read per readiness before the loop runs anything else. asyncio's datagram
# transport reads one per wake (an epoll each); the relay should cost less per datagram
# than the endpoints it measures, or it becomes what the benchmark measures.
READ_BATCH = 64
MAX_DATAGRAM = 65535


class ImpairmentProxy:
    """A bidirectional impairing relay between ``listen`` and ``forward`` (see module doc)."""

    def __init__(
        self,
        *,
        listen: tuple[str, int],
        forward: tuple[str, int],
        impairment: Impairment,
        seed: int = 0,
        reverse: Impairment | None = None,
        protocol: str = "udp",
        max_clients: int = 64,
    ) -> None:
        if protocol not in ("udp", "tcp"):
            raise ValueError("protocol must be 'udp' or 'tcp'")
        self.listen = listen
        self.forward = forward
        self.protocol = protocol
        self.max_clients = max_clients
        self.upstream = Link(random.Random(seed * 2 + 1), impairment)
        self.downstream = Link(random.Random(seed * 2 + 2), reverse or impairment)
        self._listener: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._clients: dict[tuple[str, int], socket.socket] = {}
        # Datagrams waiting for their departure, in one heap for both directions:
        # (when, arrival number, upstream?, data, client); one loop timer for the earliest,
        # not a TimerHandle per datagram.
        self._due: list[tuple[float, int, bool, bytes, tuple[str, int]]] = []
        self._arrivals = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._gso = gso.AVAILABLE  # cleared when the kernel refuses it
        self._upstream_family: int = socket.AF_INET
        self._upstream_addr: tuple[Any, ...] = forward
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def stats(self) -> tuple[DirectionStats, DirectionStats]:
        """(client->server, server->client) counters."""
        return self.upstream.stats, self.downstream.stats

    @property
    def listen_addr(self) -> tuple[str, int]:
        if self._listener is not None:
            name = self._listener.getsockname()
        elif self._server is not None:
            name = self._server.sockets[0].getsockname()
        else:
            raise RuntimeError("proxy not started")
        return (str(name[0]), int(name[1]))

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.protocol == "udp":
            # Resolved once here, so opening a new client's upstream socket never blocks.
            upstream = await self._loop.getaddrinfo(*self.forward, type=socket.SOCK_DGRAM)
            self._upstream_family, self._upstream_addr = upstream[0][0], upstream[0][4]
            infos = await self._loop.getaddrinfo(*self.listen, type=socket.SOCK_DGRAM)
            family, kind, proto, _, where = infos[0]
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                sock.bind(where)
            except OSError:
                sock.close()
                raise
            _set_buffers(sock, self.upstream.impairment.socket_buffer)
            self._loop.add_reader(sock.fileno(), self._read_clients, sock)
            self._listener = sock
        else:
            self._server = await asyncio.start_server(self._serve_tcp, *self.listen)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due.clear()
        for task in list(self._tasks):
            task.cancel()
        for sock in self._clients.values():
            self._close_socket(sock)
        self._clients.clear()
        if self._listener is not None:
            self._close_socket(self._listener)
            self._listener = None
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def _close_socket(self, sock: socket.socket) -> None:
        assert self._loop is not None
        self._loop.remove_reader(sock.fileno())
        sock.close()

    # ---------------------------------------------------------------- UDP

    def _read_clients(self, sock: socket.socket) -> None:
        """Datagrams from clients (towards ``forward``): every one waiting, up to a batch."""
        assert self._loop is not None
        now = self._loop.time()
        for _ in range(READ_BATCH):
            try:
                data, addr = sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue  # a queued ICMP error: nothing to relay
            client = (str(addr[0]), int(addr[1]))
            if client not in self._clients and not self._open_upstream(client):
                continue
            self._schedule(now, True, data, client, self.upstream)
        self._arm()

    def _read_server(self, sock: socket.socket, client: tuple[str, int]) -> None:
        """Datagrams from ``forward`` on ``client``'s upstream socket, back to the client."""
        assert self._loop is not None
        now = self._loop.time()
        for _ in range(READ_BATCH):
            try:
                data = sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue
            self._schedule(now, False, data, client, self.downstream)
        self._arm()

    def _open_upstream(self, client: tuple[str, int]) -> bool:
        """A socket of its own towards ``forward`` for a new client; False past the cap."""
        assert self._loop is not None and self._listener is not None
        if len(self._clients) >= self.max_clients:
            return False
        sock = socket.socket(self._upstream_family, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            sock.connect(self._upstream_addr)  # a UDP connect only sets the destination
        except OSError:
            sock.close()
            return False
        _set_buffers(sock, self.downstream.impairment.socket_buffer)
        self._loop.add_reader(sock.fileno(), self._read_server, sock, client)
        self._clients[client] = sock
        return True

    def _schedule(
        self, now: float, up: bool, data: bytes, client: tuple[str, int], link: Link
    ) -> None:
        for when in link.schedule(now, len(data)):
            link.queued += 1
            self._arrivals += 1
            heapq.heappush(self._due, (when, self._arrivals, up, data, client))

    def _arm(self) -> None:
        """One loop timer, for the earliest departure (moved only when that gets earlier)."""
        assert self._loop is not None
        if not self._due:
            return
        when = self._due[0][0]
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._depart)
        self._timer_at = when

    def _depart(self) -> None:
        """Send every datagram due by now, in departure order; consecutive ones to the same
        place leave in one GSO write where the kernel takes it (``rudp.gso``)."""
        assert self._loop is not None
        self._timer = None
        now = self._loop.time()
        due = self._due
        batch: list[bytes] = []
        target: tuple[bool, tuple[str, int]] | None = None
        while due and due[0][0] <= now:
            _, _, up, data, client = heapq.heappop(due)
            link = self.upstream if up else self.downstream
            link.queued -= 1
            if (up, client) != target:
                if target is not None:
                    self._send(target, batch)
                target, batch = (up, client), []
            batch.append(data)
        if target is not None:
            self._send(target, batch)
        self._arm()

    def _send(self, target: tuple[bool, tuple[str, int]], batch: list[bytes]) -> None:
        up, client = target
        if up:
            sock, addr = self._clients.get(client), None
        else:
            sock, addr = self._listener, client
        if sock is None:
            return
        (self.upstream if up else self.downstream).stats.packets_out += len(batch)
        # A full socket buffer drops a datagram, as a full router queue would (the
        # buffers are sized so the benchmarks do not get there); so does an ICMP error.
        for start, end in gso.runs(batch) if self._gso else ((i, i + 1) for i in range(len(batch))):
            try:
                if end - start > 1:
                    gso.send_run(sock, batch[start:end], addr)
                elif addr is None:
                    sock.send(batch[start])
                else:
                    sock.sendto(batch[start], addr)
                continue
            except OSError as error:
                if end - start == 1:
                    continue
                if error.errno in gso.REFUSED:
                    self._gso = False  # no GSO here: one by one from now on
            for data in batch[start:end]:
                with contextlib.suppress(OSError):
                    if addr is None:
                        sock.send(data)
                    else:
                        sock.sendto(data, addr)

    # ---------------------------------------------------------------- TCP

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.forward)
        except OSError:
            writer.close()
            return
        pumps = [
            asyncio.ensure_future(self._pump_tcp(reader, up_writer, self.upstream)),
            asyncio.ensure_future(self._pump_tcp(up_reader, writer, self.downstream)),
        ]
        for task in pumps:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        writer.close()
        up_writer.close()

    async def _pump_tcp(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: Link
    ) -> None:
        assert self._loop is not None
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                when, chunk = await queue.get()
                if not chunk:
                    writer.write_eof()
                    return
                wait = when - self._loop.time()  # type: ignore[union-attr]
                if wait > 0:
                    await asyncio.sleep(wait)  # timed release, not synchronisation
                direction.stats.packets_out += 1
                writer.write(chunk)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                chunk = await reader.read(1400)  # about one segment per decision
                if not chunk:
                    queue.put_nowait((0.0, b""))
                    break
                queue.put_nowait((direction.schedule_stream(self._loop.time(), len(chunk)), chunk))
            await sender
        finally:
            sender.cancel()


# ---------------------------------------------------------------- command line


def parse_rate(text: str) -> float:
    """'1mbit' -> 1e6 bits/s; accepts bit, kbit, mbit, gbit (and bps suffixes)."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]?)(bit|bps)?\s*", text.lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"bad rate {text!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def parse_addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rudp.impair", description=__doc__)
    parser.add_argument("--listen", type=parse_addr, required=True)
    parser.add_argument("--forward", type=parse_addr, required=True)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--dup", type=float, default=0.0)
    parser.add_argument("--reorder", type=float, default=0.0)
    parser.add_argument("--delay", type=float, default=0.0, help="milliseconds")
    parser.add_argument("--jitter", type=float, default=0.0, help="milliseconds")
    parser.add_argument("--rate", type=parse_rate, default=None, help="e.g. 1mbit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tcp", action="store_true", help="relay TCP instead of UDP")
    parser.add_argument(
        "--socket-buffer", type=int, default=4 << 20, help="UDP socket buffer bytes (0: system)"
    )
    parser.add_argument(
        "--max-clients", type=int, default=64, help="UDP client addresses relayed (others dropped)"
    )
    args = parser.parse_args(argv)
    impairment = Impairment(
        loss=args.loss,
        dup=args.dup,
        reorder=args.reorder,
        delay=args.delay / 1000,
        jitter=args.jitter / 1000,
        rate=args.rate,
        socket_buffer=args.socket_buffer,
    )

    async def run() -> None:
        proxy = ImpairmentProxy(
            listen=args.listen,
            forward=args.forward,
            impairment=impairment,
            seed=args.seed,
            protocol="tcp" if args.tcp else "udp",
            max_clients=args.max_clients,
        )
        await proxy.start()
        print(f"impairing {proxy.listen_addr} -> {args.forward}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await proxy.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    main()
