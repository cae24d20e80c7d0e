"""A REGISTER without credentials is challenged at once, without the store; an
in-dialog request whose owner's HA1 left the cache is challenged, not failed.

The registrar authenticates before it reads a binding (RFC 3261 §10.3 steps 3-4 before
7-8), so the broker answers such a REGISTER without a database round trip: the first
REGISTER of every device, and a flood of unauthenticated ones, neither waits behind
other REGISTERs' commits nor adds work to the database thread. The probe holds the
broker's database thread (a call that waits on an event) while a REGISTER arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Iterator

import pytest

from mdeci.broker.app import RunningBroker
from mdeci.broker.sip_auth import CACHED_HA1
from sip.errors import SipRequestFailed
from sip.message import Response, parse_message
from sip.uac import PADDING
from tests.broker.conftest import WaitingSink
from tests.broker.test_service import GUARD
from tests.broker.test_sip_endpoint import DOMAIN, Device, devices, open_device, running

__all__ = ["devices", "running"]  # the fixtures, used by name

PAD_TO = 1024  # the broker bounds an unauthenticated UDP answer by the request's size


class _Client(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.responses: asyncio.Queue[Response] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        msg = parse_message(data)
        assert isinstance(msg, Response)
        self.responses.put_nowait(msg)


def _register(user: str, port: int, credentials: str = "") -> bytes:
    head = (
        f"REGISTER sip:{DOMAIN} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK{secrets.token_hex(8)};rport\r\n"
        "Max-Forwards: 70\r\n"
        f"From: <sip:{user}@{DOMAIN}>;tag={secrets.token_hex(4)}\r\n"
        f"To: <sip:{user}@{DOMAIN}>\r\n"
        f"Call-ID: {secrets.token_hex(8)}\r\n"
        "CSeq: 1 REGISTER\r\n"
        f"Contact: <sip:{user}@127.0.0.1:{port}>\r\n"
        f"{credentials}"
    )
    tail = "Content-Length: 0\r\n\r\n"
    pad = PAD_TO - len(head) - len(tail) - len(PADDING + ": \r\n")
    return (head + f"{PADDING}: {'x' * pad}\r\n" + tail).encode()


@pytest.fixture
def held_db(running: RunningBroker) -> Iterator[threading.Event]:
    """The broker's database thread, busy until the event is set."""
    gate = threading.Event()
    running.endpoint.worker.post("held by the test", gate.wait, GUARD * 4)
    yield gate
    gate.set()


@pytest.mark.parametrize(
    ("credentials", "status"),
    [
        ("", 401),
        # Credentials for another realm are not ours to check (§22.3): challenged.
        ('Authorization: Digest username="alice", realm="elsewhere", nonce="n", '
         'uri="sip:x", response="00"\r\n', 401),
        ("Authorization: Digest username=\r\n", 400),  # unreadable: 400, nothing read
    ],
)  # fmt: skip
async def test_a_register_without_credentials_is_answered_while_the_database_is_busy(
    running: RunningBroker, held_db: threading.Event, credentials: str, status: int
) -> None:
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_datagram_endpoint(_Client, local_addr=("127.0.0.1", 0))
    try:
        port = transport.get_extra_info("sockname")[1]
        transport.sendto(_register("alice", port, credentials), running.sip_addr)
        response = await asyncio.wait_for(client.responses.get(), GUARD)
        assert response.status == status, response
        assert not held_db.is_set()  # answered while the database thread was held
        assert (response.headers.get("WWW-Authenticate") is not None) == (status == 401)
    finally:
        transport.close()


async def test_a_reinvite_whose_owner_left_the_credential_cache_is_not_a_failed_login(
    running: RunningBroker, sink: WaitingSink, devices: list[Device]
) -> None:
    """With more users than the cache holds, an owner's entries may be gone when their
    re-INVITE comes: the guard (synchronous) challenges and fetches them for the retry,
    and counts no failed login (the throttle would lock out a device that did nothing
    wrong)."""
    alice = await open_device(devices, "alice", "127.0.0.2")
    await alice.call(running)
    await sink.wait_for("media_connected", f"sip:alice@{DOMAIN}")
    # Other users' entries, as many as the cache holds: alice's are the oldest, dropped.
    realm = running.endpoint.config.realm
    running.endpoint.credentials.keep(
        {(f"other{i}", realm, "SHA-256"): None for i in range(CACHED_HA1)}
    )
    assert not running.endpoint.credentials.knows("alice", realm)
    # The re-INVITE is challenged; the device's one retry may come before the entries
    # are back (the fetch is on the database thread), and then fails as before.
    with contextlib.suppress(SipRequestFailed):
        await alice.move("127.0.0.3")
    assert running.endpoint.digest.failures == 0
