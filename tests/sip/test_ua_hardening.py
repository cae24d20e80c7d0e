"""The asyncio UA on loopback: moves, CANCEL, caps and refusals.

- a move with ``unregister_old`` removes the old contact (one binding);
- CANCEL of an INVITE the application is still answering: 200, then 487 (§9.2);
- a cap of open requests per source (503 beyond it), the handler never sees the excess;
- a challenge is sent once, statelessly: no transaction kept, no 401 retransmission;
- the 400 for a malformed request goes to the packet's source, not to its Via.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import AsyncIterator

import pytest

from sip.aio.ua import IncomingRequest, Reply, UaConfig, UserAgent
from sip.errors import SipRequestFailed
from sip.message import Response, parse_message
from sip.registrar import MemoryBindingStore, Registrar, RegistrarConfig
from sip.tools.registrar import RegistrarService
from sip.transaction import TimerConfig

FAST = TimerConfig(t1=0.05, t2=0.4, t4=0.5)
GUARD = 10.0


def raw_request(method: str, port: int, call_id: str, *, via_port: int | None = None) -> bytes:
    return (
        f"{method} sip:ua@127.0.0.1 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{via_port or port};branch=z9hG4bK-{call_id}\r\n"
        "Max-Forwards: 70\r\nFrom: <sip:t@example.org>;tag=f\r\nTo: <sip:ua@example.org>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 {method}\r\nContent-Length: 0\r\n\r\n"
    ).encode()


@pytest.fixture
async def sock() -> AsyncIterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    yield s
    s.close()


async def recv(s: socket.socket, timeout: float = GUARD) -> Response:
    data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(s, 65536), timeout)
    msg = parse_message(data)
    assert isinstance(msg, Response)
    return msg


async def test_move_removes_the_old_contact() -> None:
    registrar = Registrar(
        RegistrarConfig(domains=("example.org", "127.0.0.1")),
        MemoryBindingStore(),
        secrets.token_bytes,
    )
    home = UserAgent(
        UaConfig(aor="sip:registrar@example.org", methods=frozenset({"REGISTER"}), timers=FAST),
        RegistrarService(registrar, True),
    )
    home_addr = await home.start("127.0.0.1")
    ua = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST))
    await ua.start("127.0.0.2")
    loop = asyncio.get_running_loop()
    try:
        await ua.register(home_addr, 600)
        first = ua.contact_uri
        for host in ("127.0.0.3", "127.0.0.4", "127.0.0.2"):
            await asyncio.wait_for(ua.move(host, unregister_old=True), GUARD)
        contacts = [b.contact for b in registrar.lookup("sip:alice@example.org", loop.time())]
        assert contacts == [ua.contact_uri]
        assert first != ua.contact_uri
    finally:
        await ua.close()
        await home.close()


async def test_cancel_of_a_pending_invite_gets_200_then_487() -> None:
    release = asyncio.Event()
    seen = asyncio.Event()

    async def slow(req: IncomingRequest) -> Reply:
        seen.set()
        await release.wait()  # the application has not decided yet
        return Reply(200, body=b"v=0")

    bob = UserAgent(UaConfig(aor="sip:bob@example.org", timers=FAST), slow)
    await bob.start("127.0.0.1")
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST))
    await alice.start("127.0.0.1")
    try:
        invite = alice.build_request(
            "INVITE", "sip:bob@example.org", to="<sip:bob@example.org>", body=b"v=0"
        )
        pending = asyncio.create_task(alice.request(invite, bob.local_addr))
        await asyncio.wait_for(seen.wait(), GUARD)  # the application has the INVITE
        cancel = alice.build_request(
            "CANCEL", "sip:bob@example.org", to="<sip:bob@example.org>", call_id=invite.call_id
        )
        cancel.headers.set("Via", invite.headers.get_raw("Via")[0])
        cancel.headers.set("From", invite.headers.get("From") or "")
        answer = await asyncio.wait_for(alice.request(cancel, bob.local_addr), GUARD)
        assert answer.status == 200
        final = await asyncio.wait_for(pending, GUARD)
        assert final.status == 487
        release.set()  # the late answer of the application is discarded
        assert bob.dialogs == {}
    finally:
        release.set()
        await alice.close()
        await bob.close()


async def test_open_requests_per_source_are_capped(sock: socket.socket) -> None:
    release = asyncio.Event()
    handled = 0

    async def slow(req: IncomingRequest) -> Reply:
        nonlocal handled
        handled += 1
        await release.wait()
        return Reply(200)

    cap = 8
    ua = UserAgent(
        UaConfig(aor="sip:ua@example.org", timers=FAST, methods=frozenset({"INVITE", "MESSAGE"}),
                 max_open_per_source=cap),
        slow,
    )  # fmt: skip
    await ua.start("127.0.0.1")
    loop = asyncio.get_running_loop()
    port = sock.getsockname()[1]
    try:
        for i in range(cap + 5):
            await loop.sock_sendto(sock, raw_request("MESSAGE", port, f"m{i}"), ua.local_addr)
        refused = 0
        while refused < 5:
            response = await recv(sock)
            assert response.status == 503
            assert response.headers.get("Retry-After") == "5"
            refused += 1
        assert handled == cap
        assert ua.stats.over_cap == 5
    finally:
        release.set()
        await ua.close()


async def test_challenge_is_stateless_and_sent_once(sock: socket.socket) -> None:
    async def challenge(req: IncomingRequest) -> Reply:
        return Reply(401, headers=(("WWW-Authenticate", 'Digest realm="x", nonce="n"'),))

    ua = UserAgent(UaConfig(aor="sip:ua@example.org", timers=FAST), challenge)
    await ua.start("127.0.0.1")
    loop = asyncio.get_running_loop()
    port = sock.getsockname()[1]
    try:
        invite = raw_request("INVITE", port, "c1")
        await loop.sock_sendto(sock, invite, ua.local_addr)
        statuses = [(await recv(sock)).status, (await recv(sock)).status]
        assert statuses == [100, 401]
        # Nothing kept for the unauthenticated INVITE...
        assert ua.layer.open_from("127.0.0.1") == 0
        # ...and no 401 retransmission (timer G would resend at 0.05, 0.1, 0.2 s...): the
        # next thing we receive is the answer to a later probe, not a resent 401.
        await loop.sock_sendto(sock, raw_request("OPTIONS", port, "probe"), ua.local_addr)
        after = await recv(sock)
        assert (after.call_id, after.status) == ("probe", 200)
    finally:
        await ua.close()


async def test_the_proxy_in_front_gets_a_200_larger_than_its_small_options(
    sock: socket.socket,
) -> None:
    """A dispatcher's OPTIONS probe is smaller than our 200: a source the bound exempts
    (the proxy in front) gets it; any other source gets nothing (counted)."""
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.bind(("127.0.0.1", 0))
    other.setblocking(False)
    proxy = sock.getsockname()
    config = UaConfig(
        aor="sip:ua@example.org", timers=FAST, max_answer_ratio=1.0,
        unbounded_sources=frozenset({proxy}),
    )  # fmt: skip
    ua = UserAgent(config)
    await ua.start("127.0.0.1")
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_sendto(sock, raw_request("OPTIONS", proxy[1], "p1"), ua.local_addr)
        answer = await recv(sock)
        assert (answer.call_id, answer.status) == ("p1", 200)
        port = other.getsockname()[1]
        await loop.sock_sendto(other, raw_request("OPTIONS", port, "p2"), ua.local_addr)
        # The same probe from the proxy after it: once its 200 is here, p2 was handled.
        await loop.sock_sendto(sock, raw_request("OPTIONS", proxy[1], "p3"), ua.local_addr)
        assert (await recv(sock)).call_id == "p3"
        assert ua.stats.too_large == 1
        with pytest.raises(BlockingIOError):
            other.recv(65536)
    finally:
        other.close()
        await ua.close()


async def test_400_goes_to_the_source_not_the_via(sock: socket.socket) -> None:
    victim = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    victim.bind(("127.0.0.1", 0))
    victim.setblocking(False)
    ua = UserAgent(UaConfig(aor="sip:ua@example.org", timers=FAST))
    await ua.start("127.0.0.1")
    loop = asyncio.get_running_loop()
    try:
        bad = raw_request("OPTIONS", sock.getsockname()[1], "bad", via_port=victim.getsockname()[1])
        bad = bad.replace(b"Max-Forwards: 70", b"Max-Forwards: lots")
        await loop.sock_sendto(sock, bad, ua.local_addr)
        response = await recv(sock)
        assert response.status == 400 and response.call_id == "bad"
        with pytest.raises(BlockingIOError):
            victim.recv(65536)  # the Via's address got nothing (the 400 already came back)
    finally:
        victim.close()
        await ua.close()


async def test_refused_register_reports_the_status() -> None:
    ua = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST))
    await ua.start("127.0.0.1")
    other = UserAgent(UaConfig(aor="sip:x@example.org", timers=FAST))  # serves no REGISTER
    addr = await other.start("127.0.0.1")
    try:
        with pytest.raises(SipRequestFailed) as info:
            await ua.register(addr, 60)
        assert info.value.status == 405
    finally:
        await ua.close()
        await other.close()
