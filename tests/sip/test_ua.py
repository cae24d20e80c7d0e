"""The asyncio user agent on loopback: our UAC against our UAS, over UDP and TCP."""

from __future__ import annotations

import asyncio
import socket

import pytest

from sip.aio.ua import (
    DialogConfirmed,
    DialogEnded,
    DialogRefreshed,
    DialogStarted,
    IncomingRequest,
    Reply,
    UaConfig,
    UserAgent,
)
from sip.errors import SipRequestFailed
from sip.transaction import TimerConfig

FAST = TimerConfig(t1=0.05, t2=0.4, t4=0.5, timer_d=0.5)


async def answer_all(req: IncomingRequest) -> Reply:
    if req.request.method == "INVITE":
        return Reply(200, body=b"v=0 answer " + req.request.body)
    return Reply(200)


async def pair(tcp: bool = True) -> tuple[UserAgent, UserAgent]:
    bob = UserAgent(UaConfig(aor="sip:bob@example.org", timers=FAST, tcp=tcp), answer_all)
    await bob.start("127.0.0.1")
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST, tcp=tcp))
    await alice.start("127.0.0.1")
    return alice, bob


async def next_event(ua: UserAgent, kind: type) -> object:
    while True:
        event = await asyncio.wait_for(ua.events.get(), 5)
        if isinstance(event, kind):
            return event


@pytest.mark.parametrize("transport", ["udp", "tcp"])
async def test_invite_reinvite_bye(transport: str) -> None:
    alice, bob = await pair()
    try:
        dialog, response = await alice.invite(
            "sip:bob@example.org", bob.local_addr, b"offer", transport=transport
        )
        assert response.status == 200
        assert response.body == b"v=0 answer offer"
        started = await next_event(bob, DialogStarted)
        assert isinstance(started, DialogStarted)
        if transport == "udp":
            # The ACK reached bob: its 2xx retransmission stopped (§13.3.1.4).
            assert isinstance(await next_event(bob, DialogConfirmed), DialogConfirmed)
        bob_dialog = started.dialog
        assert bob_dialog.call_id == dialog.call_id
        assert bob_dialog.remote_tag == dialog.local_tag

        # Re-INVITE: same dialog, CSeq up by one, bob sees the new body.
        re = await alice.reinvite(dialog, b"offer2", transport=transport)
        assert re.status == 200 and re.body == b"v=0 answer offer2"
        refreshed = await next_event(bob, DialogRefreshed)
        assert isinstance(refreshed, DialogRefreshed) and refreshed.body == b"offer2"
        assert dialog.local_seq == 2 and bob_dialog.remote_seq == 2

        bye = await alice.bye(dialog, transport=transport)
        assert bye.status == 200
        ended = await next_event(bob, DialogEnded)
        assert isinstance(ended, DialogEnded) and ended.reason == "bye received"
        assert bob.dialogs == {} and alice.dialogs == {}
    finally:
        await alice.close()
        await bob.close()


async def test_move_keeps_the_dialog() -> None:
    alice, bob = await pair()
    try:
        dialog, _ = await alice.invite("sip:bob@example.org", bob.local_addr, b"o1")
        started = await next_event(bob, DialogStarted)
        assert isinstance(started, DialogStarted)
        old = alice.local_addr
        new = await alice.move("127.0.0.3", 0, reinvite_body=lambda d: b"moved")
        assert new[0] == "127.0.0.3" and new != old
        refreshed = await next_event(bob, DialogRefreshed)
        assert isinstance(refreshed, DialogRefreshed)
        # Bob's dialog now targets alice's new address (target refresh, §12.2.2).
        assert "127.0.0.3" in started.dialog.remote_target
        assert alice.dialogs == {dialog.id: dialog}
        # And bob can reach her there: a BYE from bob's side arrives.
        response = await bob.bye(started.dialog)
        assert response.status == 200
        ended = await next_event(alice, DialogEnded)
        assert isinstance(ended, DialogEnded)
    finally:
        await alice.close()
        await bob.close()


async def test_unknown_dialog_gets_481_and_options_200() -> None:
    alice, bob = await pair()
    try:
        dialog, _ = await alice.invite("sip:bob@example.org", bob.local_addr, b"o")
        # Forget the dialog on bob's side: an in-dialog request now matches nothing.
        started = await next_event(bob, DialogStarted)
        assert isinstance(started, DialogStarted)
        bob.dialogs.clear()
        response = await alice.in_dialog(dialog, "INFO")
        assert response.status == 481
        options = alice.build_request("OPTIONS", "sip:bob@example.org", to="<sip:bob@example.org>")
        answer = await alice.request(options, bob.local_addr)
        assert answer.status == 200 and "INVITE" in (answer.headers.get("Allow") or "")
    finally:
        await alice.close()
        await bob.close()


async def test_refused_invite_raises_and_ack_is_sent() -> None:
    async def busy(req: IncomingRequest) -> Reply:
        return Reply(486)

    bob = UserAgent(UaConfig(aor="sip:bob@example.org", timers=FAST), busy)
    await bob.start("127.0.0.1")
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST))
    await alice.start("127.0.0.1")
    try:
        with pytest.raises(SipRequestFailed) as info:
            await alice.invite("sip:bob@example.org", bob.local_addr, b"o")
        assert info.value.status == 486
        assert alice.dialogs == {}
    finally:
        await alice.close()
        await bob.close()


async def test_timeout_is_408() -> None:
    # A UDP port nobody answers on: Timer B fires at 64*T1 and the INVITE fails with 408.
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    silent.bind(("127.0.0.1", 0))
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=TimerConfig(t1=0.01)))
    await alice.start("127.0.0.1")
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(SipRequestFailed) as info:
            await alice.invite("sip:bob@example.org", silent.getsockname(), b"o")
        assert info.value.status == 408
        assert loop.time() - began >= 64 * 0.01
    finally:
        await alice.close()
        silent.close()


async def test_malformed_request_gets_400_and_ua_keeps_serving() -> None:
    alice, bob = await pair()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    port = sock.getsockname()[1]
    try:
        bad = (
            f"OPTIONS sip:bob@example.org SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bKbad1\r\n"
            "From: <sip:x@example.org>;tag=1\r\n"
            "To: <sip:bob@example.org>\r\n"
            "Call-ID: bad1\r\n"
            "CSeq: notanumber OPTIONS\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()
        sock.sendto(bad, bob.local_addr)
        data, _ = await asyncio.get_running_loop().run_in_executor(None, sock.recvfrom, 65535)
        assert data.startswith(b"SIP/2.0 400 ")
        assert b"Warning: 399" in data
        sock.sendto(b"\x00\xffgarbage", bob.local_addr)  # unparseable: dropped, counted
        options = alice.build_request("OPTIONS", "sip:bob@example.org", to="<sip:bob@example.org>")
        answer = await alice.request(options, bob.local_addr)
        assert answer.status == 200
        assert bob.stats.malformed >= 1 and bob.stats.answered_400 >= 1
    finally:
        sock.close()
        await alice.close()
        await bob.close()


async def test_large_request_goes_over_tcp() -> None:
    alice, bob = await pair()
    try:
        body = b"x" * 3000  # over the 1300-byte threshold of §18.1.1
        dialog, response = await alice.invite("sip:bob@example.org", bob.local_addr, body)
        assert response.status == 200 and response.body.endswith(body)
        assert bob.local_addr in alice.transports.tcp_conns
        await alice.bye(dialog)
    finally:
        await alice.close()
        await bob.close()


async def test_ipv6() -> None:
    try:
        probe = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    bob = UserAgent(UaConfig(aor="sip:bob@example.org", timers=FAST), answer_all)
    await bob.start("::1")
    alice = UserAgent(UaConfig(aor="sip:alice@example.org", timers=FAST))
    await alice.start("::1")
    try:
        dialog, response = await alice.invite("sip:bob@example.org", bob.local_addr, b"six")
        assert response.status == 200
        assert "[::1]" in dialog.remote_target
        assert (await alice.bye(dialog)).status == 200
    finally:
        await alice.close()
        await bob.close()
