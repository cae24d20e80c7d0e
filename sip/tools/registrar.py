"""``python -m sip registrar``: the registrar and location service of one domain
(RFC 3261 §10.3) on UDP and TCP, with digest authentication when ``--users`` is given.
Prints one line per binding change, flushed, so a test or a person can follow it."""

from __future__ import annotations

import argparse
import asyncio
import secrets
from pathlib import Path

from sip.aio.ua import IncomingRequest, Reply, UaConfig, UserAgent
from sip.auth import DigestConfig, DigestServer, MemoryCredentialStore
from sip.registrar import (
    MemoryBindingStore,
    Registered,
    Registrar,
    RegistrarConfig,
    RegistrarEvent,
    RegistrationExpired,
    Unregistered,
)
from sip.tools.common import hostport, stop_on_signals


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
    """Feeds REGISTERs from a :class:`UserAgent` to the sans-IO :class:`Registrar`."""

    def __init__(self, registrar: Registrar, quiet: bool) -> None:
        self.registrar = registrar
        self.quiet = quiet

    async def __call__(self, req: IncomingRequest) -> Reply:
        request = req.request
        if request.method != "REGISTER":
            return Reply(405)
        now = asyncio.get_running_loop().time()
        source = f"{req.source[0]}:{req.source[1]}"
        response = self.registrar.handle(request, now, source=source)
        self.print_events()
        return Reply.from_response(response)

    def print_events(self) -> None:
        while (event := self.registrar.next_event()) is not None:
            if not self.quiet:
                print(describe(event), flush=True)


async def serve(args: argparse.Namespace) -> int:
    host, port = args.listen
    auth = None
    if args.users is not None:
        creds = load_users(args.users, args.domain)
        algorithms = tuple(args.algorithm) if args.algorithm else ("SHA-256", "MD5")
        auth = DigestServer(DigestConfig(realm=args.domain, algorithms=algorithms), creds,
                            secrets.token_bytes)  # fmt: skip
    registrar = Registrar(
        # A REGISTER addressed to our own IP (as most phones send it) is for our domain too.
        RegistrarConfig(
            domains=(args.domain, host), default_expires=600, min_expires=args.min_expires
        ),
        MemoryBindingStore(),
        secrets.token_bytes,
        auth=auth,
    )
    service = RegistrarService(registrar, args.quiet)
    ua = UserAgent(
        UaConfig(aor=f"sip:registrar@{args.domain}", methods=frozenset({"REGISTER"})), service
    )
    bound = await ua.start(host, port)
    print(f"registrar listening on {bound[0]}:{bound[1]} (udp, tcp)", flush=True)
    stop = stop_on_signals()
    loop = asyncio.get_running_loop()
    try:
        while not stop.is_set():
            # Bindings that ran out are reported once a second (the sweep of §10.3).
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                registrar.expire(loop.time())
                service.print_events()
    finally:
        await ua.close()
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
