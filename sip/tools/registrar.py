"""``python -m sip registrar``: the registrar and location service of one domain
(RFC 3261 §10.3) on UDP and TCP, with digest authentication when ``--users`` is given.
Prints one line per binding change, flushed, so a test or a person can follow it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sip.aio.transport import Address, bind_sockets, spread_by_payload
from sip.aio.ua import IncomingRequest, Reply, UaConfig, UserAgent
from sip.auth import DigestConfig, DigestServer, MemoryCredentialStore
from sip.fastpath import FastRegistrar, ResponseCache
from sip.registrar import (
    BindingStore,
    MemoryBindingStore,
    Registered,
    Registrar,
    RegistrarConfig,
    RegistrarEvent,
    RegistrationExpired,
    Unregistered,
)
from sip.tools.common import hostport, stop_on_signals
from sip.tools.sqlitestore import SqliteBindingStore


def load_users(path: Path, realm: str) -> MemoryCredentialStore:
    """``user password`` per line (``#`` comments). Raises ValueError on a bad line."""
    store = MemoryCredentialStore()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected 'user password'")
        store.add_password(parts[0], realm, parts[1])
    return store


def describe(event: RegistrarEvent) -> str:
    """One line per registrar event."""
    if isinstance(event, Registered):
        verb = "refreshed" if event.refreshed else "registered"
        return f"{verb} {event.aor} contact={event.contact} expires={event.expires}"
    if isinstance(event, Unregistered):
        return f"unregistered {event.aor} contact={event.contact}"
    assert isinstance(event, RegistrationExpired)
    return f"expired {event.aor} contact={event.contact}"


class RegistrarService:
    """Feeds REGISTERs from a :class:`UserAgent` to the sans-IO :class:`Registrar` (the
    full path); with ``fast``, plain REGISTERs over UDP skip the UA (:meth:`on_datagrams`).
    ``store`` is the SQLite store when bindings are shared with other workers: each
    REGISTER (full path) or each batch (fast path) is then one transaction."""

    def __init__(
        self,
        registrar: Registrar,
        quiet: bool,
        *,
        clock: Callable[[], float] = time.time,
        store: SqliteBindingStore | None = None,
    ) -> None:
        self.registrar = registrar
        self.quiet = quiet
        self.clock = clock
        self.store = store
        self.fast: FastRegistrar | None = None
        self.ua: UserAgent | None = None
        self.store_errors = 0

    async def __call__(self, req: IncomingRequest) -> Reply:
        request = req.request
        if request.method != "REGISTER":
            return Reply(405)
        source = f"{req.source[0]}:{req.source[1]}"
        store = self.store
        if store is not None:
            store.begin()
        try:
            response = self.registrar.handle(request, self.clock(), source=source)
            if store is not None:
                store.commit()
        except sqlite3.Error:
            return self._failed()
        self.print_events()
        return Reply.from_response(response)

    def _failed(self) -> Reply:
        assert self.store is not None
        self.store.rollback()
        self.store_errors += 1
        while self.registrar.next_event() is not None:
            pass  # nothing was stored: no change to report
        return Reply(500, reason="Server Internal Error (binding store)")

    def on_datagrams(self, batch: Sequence[tuple[bytes, Address]]) -> None:
        """A batch read from the UDP socket: plain REGISTERs answered here with one store
        commit before any answer goes out; the rest to the UA (full path)."""
        fast, ua = self.fast, self.ua
        assert fast is not None and ua is not None
        now = self.clock()
        answers: list[tuple[bytes, Address]] = []
        rest: list[tuple[bytes, Address]] = []
        store = self.store
        if store is not None:
            store.begin()
        fast.begin()
        handle = fast.handle
        try:
            for data, source in batch:
                answer = handle(data, source, now)
                if answer is None:
                    rest.append((data, source))
                else:
                    answers.append(answer)
            if store is not None:
                store.commit()
        except sqlite3.Error:
            # Nothing stored, nothing answered: the clients retransmit.
            fast.abort()
            self._failed()
            answers = []
        transports = ua.transports
        transports.send_udp(answers)
        self.print_events()
        for data, source in rest:
            transports.on_datagram(data, source, "udp")

    def print_events(self) -> None:
        lines: list[str] = []
        while (event := self.registrar.next_event()) is not None:
            if not self.quiet:
                lines.append(describe(event) + "\n")
        # One write per few lines: lines of several workers share one pipe, and a
        # write under PIPE_BUF bytes is never interleaved with another.
        chunk: list[str] = []
        size = 0
        for line in lines:
            if size + len(line) > 3500 and chunk:
                sys.stdout.write("".join(chunk))
                sys.stdout.flush()
                chunk, size = [], 0
            chunk.append(line)
            size += len(line)
        if chunk:
            sys.stdout.write("".join(chunk))
            sys.stdout.flush()


def _worker_argv(args: argparse.Namespace, fds: tuple[int, int], store: Path) -> list[str]:
    argv = [sys.executable, "-m", "sip", "registrar",
            "--listen", f"{args.listen[0]}:{args.listen[1]}", "--domain", args.domain,
            "--min-expires", str(args.min_expires), "--store", str(store),
            "--cache-size", str(args.cache_size), "--worker-fds", f"{fds[0]},{fds[1]}"]  # fmt: skip
    if args.users is not None:
        argv += ["--users", str(args.users)]
    for algorithm in args.algorithm or ():
        argv += ["--algorithm", algorithm]
    if args.quiet:
        argv.append("--quiet")
    if args.no_fast_path:
        argv.append("--no-fast-path")
    return argv


async def serve(args: argparse.Namespace) -> int:
    workers = args.workers or os.cpu_count() or 1
    if args.worker_fds is not None:
        udp_fd, tcp_fd = (int(x) for x in args.worker_fds.split(","))
        udp = socket.socket(fileno=udp_fd)
        tcp = socket.socket(fileno=tcp_fd)
        return await _serve_on(args, udp, tcp, worker=True)
    host, port = args.listen
    if workers == 1:
        udp, tcp = bind_sockets(host, port)
        return await _serve_on(args, udp, tcp, worker=False)
    return await _supervise(args, workers)


async def _supervise(args: argparse.Namespace, workers: int) -> int:
    """Bind one UDP and one TCP socket per worker (SO_REUSEPORT, one port), hand each
    pair to a worker process, and stop them on SIGINT/SIGTERM."""
    host, port = args.listen
    with contextlib.ExitStack() as stack:
        store = args.store
        if store is None:
            # In memory (tmpfs) where there is one: the file lives as long as we do, so
            # the fsyncs of WAL checkpoints would buy nothing.
            shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
            store = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=shm))) / "bindings.db"
        SqliteBindingStore(store).close()  # the schema, before the workers race for it
        pairs: list[tuple[socket.socket, socket.socket]] = []
        for _ in range(workers):
            pairs.append(bind_sockets(host, port, reuse_port=True))
            port = pairs[0][0].getsockname()[1]
        if args.users is None:
            # Without digest no state ties a client to a worker but the answers kept for
            # retransmissions, which the same bytes find again.
            spread_by_payload(pairs[0][0], workers)
        children: list[subprocess.Popen[bytes]] = []
        for udp, tcp in pairs:
            fds = (udp.fileno(), tcp.fileno())
            children.append(subprocess.Popen(_worker_argv(args, fds, store), pass_fds=fds))
            # The worker has its copies; ours would take a share of the traffic unread.
            udp.close()
            tcp.close()
        print(f"registrar listening on {host}:{port} (udp, tcp; {workers} workers)", flush=True)
        stop = stop_on_signals()
        try:
            while not stop.is_set() and all(c.poll() is None for c in children):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
        finally:
            for child in children:
                if child.poll() is None:
                    child.terminate()  # our own child, by its PID
            for child in children:
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait(5)
        return 0 if stop.is_set() else 1


async def _serve_on(
    args: argparse.Namespace, udp: socket.socket, tcp: socket.socket, *, worker: bool
) -> int:
    host = args.listen[0]
    auth = None
    if args.users is not None:
        creds = load_users(args.users, args.domain)
        algorithms = tuple(args.algorithm) if args.algorithm else ("SHA-256", "MD5")
        auth = DigestServer(DigestConfig(realm=args.domain, algorithms=algorithms), creds,
                            secrets.token_bytes)  # fmt: skip
    sql = SqliteBindingStore(args.store) if args.store is not None else None
    store: BindingStore = sql if sql is not None else MemoryBindingStore()
    registrar = Registrar(
        # A REGISTER addressed to our own IP (as most phones send it) is for our domain too.
        RegistrarConfig(
            domains=(args.domain, host), default_expires=600, min_expires=args.min_expires
        ),
        store,
        secrets.token_bytes,
        auth=auth,
        events=not args.quiet,
    )
    service = RegistrarService(registrar, args.quiet, store=sql)
    config = UaConfig(aor=f"sip:registrar@{args.domain}", methods=frozenset({"REGISTER"}))
    ua = UserAgent(config, service)
    service.ua = ua
    if auth is None and not args.no_fast_path:
        # With digest every REGISTER needs the full rules (challenge, nonce state).
        service.fast = FastRegistrar(
            registrar, config.user_agent, cache=ResponseCache(limit=args.cache_size)
        )
        ua.transports.on_datagrams = service.on_datagrams
    bound = await ua.start_on(udp, tcp)
    if not worker:
        print(f"registrar listening on {bound[0]}:{bound[1]} (udp, tcp)", flush=True)
    stop = stop_on_signals()
    parent = os.getppid()
    try:
        while not stop.is_set():
            # Bindings that ran out are reported once a second (the sweep of §10.3).
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                if worker and os.getppid() != parent:
                    break  # the supervisor is gone: so are we
                try:
                    registrar.expire(service.clock())
                except sqlite3.Error:
                    service.store_errors += 1
                service.print_events()
    finally:
        await ua.close()
        if sql is not None:
            sql.close()
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", type=hostport, default=("127.0.0.1", 5070))
    parser.add_argument("--domain", default="example.org")
    parser.add_argument("--users", type=Path, help="file of 'user password' lines: digest on")
    parser.add_argument(
        "--algorithm", action="append", choices=("SHA-256", "MD5"),
        help="digest algorithm to offer (repeat for several; default SHA-256 then MD5)",
    )  # fmt: skip
    parser.add_argument("--min-expires", type=int, default=60)
    parser.add_argument("--quiet", action="store_true", help="do not print binding changes")
    parser.add_argument(
        "--workers", type=int, default=1,
        help="worker processes sharing the port (SO_REUSEPORT) and the bindings (a SQLite "
        "file); 0: one per core",
    )  # fmt: skip
    parser.add_argument(
        "--store", type=Path,
        help="SQLite file of the bindings (default: in memory; with workers, a temporary file)",
    )  # fmt: skip
    parser.add_argument(
        "--no-fast-path", action="store_true",
        help="every REGISTER through the full stack (parser, transaction, registrar)",
    )  # fmt: skip
    parser.add_argument(
        "--cache-size", type=int, default=65536,
        help="answers kept for retransmissions (Timer J, 32 s) by the fast path",
    )  # fmt: skip
    parser.add_argument("--worker-fds", help=argparse.SUPPRESS)
