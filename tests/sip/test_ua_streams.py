"""SIP over TCP and TLS between two of our UAs on loopback, and the bounds on accepted
connections.

- TCP end to end: INVITE, re-INVITE and BYE from either side all travel over TCP (the
  callee's BYE follows the caller's ``;transport=tcp`` Contact); no UDP message at all.
- TLS: a ``sips:`` call to the TLS port, both sides verifying certificates made here;
  the callee's BYE goes over TLS to the caller's ``sips:`` Contact.
- The RFC 5626 CRLF keep-alive gets its pong; we ping the connections we opened.
- Bounds: a connection limit, an idle timeout, a body limit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sip.aio.ua import (
    DialogEnded,
    DialogStarted,
    IncomingRequest,
    Reply,
    UaConfig,
    UserAgent,
)
from sip.transaction import TimerConfig
from tests.sip.certs import make_certs

FAST = TimerConfig(t1=0.05, t2=0.4, t4=0.5)
GUARD = 10.0


async def answer(req: IncomingRequest) -> Reply:
    return Reply(200, body=b"v=0 answer")


async def next_event(ua: UserAgent, kind: type) -> object:
    while True:
        event = await asyncio.wait_for(ua.events.get(), GUARD)
        if isinstance(event, kind):
            return event


async def test_tcp_end_to_end_both_directions() -> None:
    bob = UserAgent(UaConfig(aor="sip:bob@example.org", timers=FAST), answer)
    await bob.start("127.0.0.1")
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST), answer)
    await alice.start("127.0.0.2")
    try:
        dialog, response = await alice.invite(
            "sip:bob@example.org", bob.local_addr, b"offer", transport="tcp"
        )
        assert response.status == 200
        started = await next_event(bob, DialogStarted)
        assert isinstance(started, DialogStarted)
        bob_dialog = started.dialog
        assert bob_dialog.remote_target.endswith(";transport=tcp")
        assert UserAgent.dialog_transport(bob_dialog) == "tcp"
        # alice's re-INVITE follows bob's Contact (;transport=tcp) on its own.
        assert UserAgent.dialog_transport(dialog) == "tcp"
        await alice.reinvite(dialog, b"offer 2")
        # bob's BYE: to alice's ;transport=tcp contact, over TCP.
        assert (await bob.bye(bob_dialog)).status == 200
        await next_event(alice, DialogEnded)
        assert alice.stats.received.get("udp", 0) == 0
        assert bob.stats.received.get("udp", 0) == 0
        assert alice.stats.received["tcp"] >= 4  # 100, 200, 200 (re-INVITE), BYE
    finally:
        await alice.close()
        await bob.close()


async def test_tls_call_with_verified_certificates(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")

    def config(aor: str) -> UaConfig:
        return UaConfig(
            aor=aor, timers=FAST, tls_cert=str(certs.cert), tls_key=str(certs.key),
            tls_ca=str(certs.ca),
        )  # fmt: skip

    bob = UserAgent(config("sip:bob@example.org"), answer)
    await bob.start("127.0.0.1")
    alice = UserAgent(config("sip:alice@example.org"), answer)
    await alice.start("127.0.0.1")
    assert bob.tls_addr is not None and alice.tls_addr is not None
    try:
        host, port = bob.tls_addr
        _dialog, response = await alice.invite(
            f"sips:bob@{host}:{port}", bob.tls_addr, b"offer", transport="tls"
        )
        assert response.status == 200
        started = await next_event(bob, DialogStarted)
        assert isinstance(started, DialogStarted)
        assert started.dialog.remote_target.startswith("sips:")
        assert UserAgent.dialog_transport(started.dialog) == "tls"
        assert (await bob.bye(started.dialog)).status == 200
        await next_event(alice, DialogEnded)
        assert alice.stats.received.get("udp", 0) == 0
        assert alice.stats.received.get("tcp", 0) == 0
        assert alice.stats.received["tls"] >= 2
    finally:
        await alice.close()
        await bob.close()


async def test_tls_refuses_an_unverified_peer(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    other = make_certs(tmp_path / "other")  # alice trusts another CA
    bob = UserAgent(
        UaConfig(aor="sip:bob@example.org", timers=FAST, tls_cert=str(certs.cert),
                 tls_key=str(certs.key)),
        answer,
    )  # fmt: skip
    await bob.start("127.0.0.1")
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST, tls_ca=str(other.ca)))
    await alice.start("127.0.0.1")
    assert bob.tls_addr is not None
    try:
        request = alice.build_request(
            "OPTIONS", "sips:bob@127.0.0.1", to="<sips:bob@127.0.0.1>", transport="tls"
        )
        response = await asyncio.wait_for(alice.request(request, bob.tls_addr, "tls"), GUARD)
        assert response.status in (408, 503)  # no connection: the transaction fails
        assert bob.stats.received.get("tls", 0) == 0
    finally:
        await alice.close()
        await bob.close()


async def tcp_client(addr: tuple[str, int]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection(*addr), GUARD)


async def test_crlf_keepalive_gets_a_pong() -> None:
    ua = UserAgent(UaConfig(aor="sip:ua@example.org", timers=FAST))
    await ua.start("127.0.0.1")
    try:
        reader, writer = await tcp_client(ua.local_addr)
        writer.write(b"\r\n\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.readexactly(2), GUARD) == b"\r\n"
        writer.close()
    finally:
        await ua.close()


async def test_keepalive_pings_only_the_connections_we_opened() -> None:
    """``ping_streams`` writes CRLFCRLF on our own connection (a flow the peer sends its
    requests back over), not on connections others opened to us."""
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.put_nowait(await reader.readuntil(b"\r\n\r\n"))  # our OPTIONS' head
        received.put_nowait(await reader.readexactly(4))
        writer.close()

    server = await asyncio.start_server(peer, "127.0.0.1", 0)
    addr = server.sockets[0].getsockname()[:2]
    ua = UserAgent(UaConfig(aor="sip:ua@example.org", timers=FAST))
    await ua.start("127.0.0.1")
    asking: asyncio.Task[object] | None = None
    writer: asyncio.StreamWriter | None = None
    try:
        _, writer = await tcp_client(ua.local_addr)  # a connection to us: never pinged
        request = ua.build_request("OPTIONS", "sip:peer@127.0.0.1", to="<sip:peer@127.0.0.1>")
        asking = asyncio.create_task(ua.request(request, addr, "tcp"))
        head = await asyncio.wait_for(received.get(), GUARD)
        assert head.startswith(b"OPTIONS ")
        assert ua.transports.ping_streams() == 1
        assert await asyncio.wait_for(received.get(), GUARD) == b"\r\n\r\n"
    finally:
        if asking is not None:
            asking.cancel()
        if writer is not None:
            writer.close()
        await ua.close()
        server.close()


async def test_connection_limit_and_idle_timeout() -> None:
    ua = UserAgent(
        UaConfig(aor="sip:ua@example.org", timers=FAST, max_tcp_connections=4,
                 tcp_idle_timeout=0.5),
    )  # fmt: skip
    await ua.start("127.0.0.1")
    writers: list[asyncio.StreamWriter] = []
    try:
        clients = [await tcp_client(ua.local_addr) for _ in range(7)]
        writers = [w for _, w in clients]
        # Over the limit: closed at once (EOF); within it: closed when idle (EOF later).
        for reader, _ in clients:
            assert await asyncio.wait_for(reader.read(), GUARD) == b""
        assert ua.transports.refused == 3
        assert ua.transports.idle_closed == 4
        assert len(ua.transports.accepted) == 0
    finally:
        for w in writers:
            w.close()
        await ua.close()


async def test_stream_body_limit_closes_without_buffering() -> None:
    ua = UserAgent(UaConfig(aor="sip:ua@example.org", timers=FAST, max_stream_body=4096))
    await ua.start("127.0.0.1")
    try:
        reader, writer = await tcp_client(ua.local_addr)
        head = (
            "OPTIONS sip:ua@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bK-b\r\n"
            "From: <sip:x@example.org>;tag=1\r\nTo: <sip:ua@example.org>\r\nCall-ID: big\r\n"
            "CSeq: 1 OPTIONS\r\nContent-Length: 1000000\r\n\r\n"
        )
        writer.write(head.encode() + b"x" * 1000)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), GUARD) == b""  # closed
        assert ua.transports.malformed == 1
        writer.close()
    finally:
        await ua.close()


@pytest.mark.parametrize("transport", ["tcp"])
async def test_sips_uri_over_tcp_gets_416(transport: str) -> None:
    ua = UserAgent(UaConfig(aor="sip:ua@example.org", timers=FAST), answer)
    await ua.start("127.0.0.1")
    caller = UserAgent(UaConfig(aor="sip:c@example.org", timers=FAST))
    await caller.start("127.0.0.1")
    try:
        request = caller.build_request(
            "OPTIONS", "sips:ua@127.0.0.1", to="<sips:ua@127.0.0.1>", transport=transport
        )
        response = await asyncio.wait_for(caller.request(request, ua.local_addr, transport), GUARD)
        assert response.status == 416
    finally:
        await caller.close()
        await ua.close()


async def test_malformed_message_on_a_stream_gets_400_and_the_connection_lives() -> None:
    """A 5,000-digit CSeq over TCP gets 400 on the same connection, which goes on
    serving (the parser refuses it instead of raising out of the stream)."""
    ua = UserAgent(UaConfig(aor="sip:ua@example.org", timers=FAST))
    await ua.start("127.0.0.1")
    try:
        reader, writer = await tcp_client(ua.local_addr)

        def options(call_id: str, cseq: str) -> bytes:
            return (
                "OPTIONS sip:ua@127.0.0.1 SIP/2.0\r\n"
                f"Via: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bK-{call_id}\r\n"
                "From: <sip:x@example.org>;tag=1\r\nTo: <sip:ua@example.org>\r\n"
                f"Call-ID: {call_id}\r\nCSeq: {cseq} OPTIONS\r\nContent-Length: 0\r\n\r\n"
            ).encode()

        async def status_of_next() -> bytes:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
            return head.split(b" ", 2)[1]

        writer.write(options("bad", "9" * 5000))
        await writer.drain()
        assert await status_of_next() == b"400"
        writer.write(options("good", "1"))
        await writer.drain()
        assert await status_of_next() == b"200"
        writer.close()
    finally:
        await ua.close()


async def test_a_peer_once_asked_over_tcp_gets_later_udp_requests_over_udp() -> None:
    """A request over TCP makes its retransmissions follow TCP only while it is in
    flight: once the connection is gone, a UDP request to the same peer goes over UDP
    (remembering every TCP destination for good would send a peer asked once over TCP
    every later request over TCP, and grow the set of such peers without bound)."""
    bob = UserAgent(UaConfig(aor="sip:bob@example.org", timers=FAST), answer)
    await bob.start("127.0.0.1")
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST))
    await alice.start("127.0.0.2")
    try:
        asked = alice.build_request("OPTIONS", "sip:bob@127.0.0.1", to="<sip:bob@127.0.0.1>")
        response = await asyncio.wait_for(alice.request(asked, bob.local_addr, "tcp"), GUARD)
        assert response.status == 200
        assert bob.stats.received.get("tcp", 0) == 1
        conn = alice.transports.conns[("tcp", bob.local_addr)]
        assert conn.transport is not None
        conn.transport.close()
        for _ in range(100):  # loop turns, not time: connection_lost comes with call_soon
            if alice.transports.stream_to(bob.local_addr) is None:
                break
            await asyncio.sleep(0)
        assert alice.transports.stream_to(bob.local_addr) is None

        again = alice.build_request("OPTIONS", "sip:bob@127.0.0.1", to="<sip:bob@127.0.0.1>")
        response = await asyncio.wait_for(alice.request(again, bob.local_addr, "udp"), GUARD)
        assert response.status == 200
        assert bob.stats.received.get("udp", 0) == 1
        assert bob.stats.received.get("tcp", 0) == 1
    finally:
        await alice.close()
        await bob.close()
