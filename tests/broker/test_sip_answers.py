"""The broker's SIP answers (issues 10 and 12) on loopback, with our UA as the device.

- OPTIONS in and out of the session, 501 for an unknown method, Allow naming REGISTER
  only in embedded-registrar mode;
- a retargeted INVITE (Request-URI rewritten to the broker's contact by a proxy) whose
  digest ``uri`` is the broker's AOR is accepted (docs/sip.md, "Digest behind a proxy");
- per-session SDP ``o=``: a sess-id per session, version + 1 per answer in that session;
- an in-dialog BYE or re-INVITE not authenticated as the session's owner changes nothing
  (the probe: an unauthenticated BYE from another address used to end the session).
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import socket

from mdeci.broker.app import RunningBroker
from sip.aio.ua import UaConfig, UserAgent
from sip.auth import DigestClient
from tests.broker.conftest import WaitingSink
from tests.broker.test_service import GUARD
from tests.broker.test_sip_endpoint import (
    ALICE,
    BROKER,
    DOMAIN,
    PASSWORDS,
    TIMERS,
    Device,
    open_device,
)

# The fixtures of the endpoint tests (a broker on a migrated SQLite store, devices).
from tests.broker.test_sip_endpoint import devices as devices
from tests.broker.test_sip_endpoint import running as running


def origin(body: bytes) -> tuple[str, int]:
    line = next(x for x in body.decode().splitlines() if x.startswith("o="))
    parts = line[2:].split()
    return parts[1], int(parts[2])


async def test_options_and_unknown_methods(running: RunningBroker, devices: list[Device]) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    ua = alice.ua
    options = ua.build_request("OPTIONS", BROKER, to=f"<{BROKER}>")
    answer = await asyncio.wait_for(ua.request(options, running.sip_addr), GUARD)
    assert answer.status == 200
    allow = {m.strip() for v in answer.headers.get_raw("Allow") for m in v.split(",")}
    assert allow == {"INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "REGISTER"}
    unknown = ua.build_request("FROBNICATE", BROKER, to=f"<{BROKER}>")
    assert (await asyncio.wait_for(ua.request(unknown, running.sip_addr), GUARD)).status == 501
    message = ua.build_request("MESSAGE", BROKER, to=f"<{BROKER}>", body=b"hi")
    refused = await asyncio.wait_for(ua.request(message, running.sip_addr), GUARD)
    assert refused.status == 405 and refused.headers.get_raw("Allow")
    # Inside the session too (it used to get 405).
    await alice.call(running)
    assert alice.dialog is not None
    in_dialog = await asyncio.wait_for(ua.in_dialog(alice.dialog, "OPTIONS"), GUARD)
    assert in_dialog.status == 200
    assert running.endpoint.session_of(ALICE) is not None


async def test_retargeted_invite_digest_names_the_aor(
    running: RunningBroker, devices: list[Device]
) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    bare = UserAgent(UaConfig(aor=ALICE, timers=TIMERS))  # answers the challenge by hand
    await bare.start("127.0.0.5")
    try:
        contact = running.endpoint.ua.contact_uri
        invite = bare.build_request("INVITE", BROKER, to=f"<{BROKER}>", body=alice.offer())
        invite.headers.set("Content-Type", "application/sdp")
        # What a proxy's location lookup does: the Request-URI becomes our contact.
        retargeted = copy.deepcopy(invite)
        retargeted.uri = contact
        challenge = await asyncio.wait_for(bare.request(retargeted, running.sip_addr), GUARD)
        assert challenge.status == 401
        # The device answered for the request it sent: uri = the AOR it INVITEd.
        client = DigestClient("alice", PASSWORDS["alice"], secrets.token_bytes)
        name, value = client.respond(challenge, invite)
        assert f'uri="{BROKER}"' in value
        retry = copy.deepcopy(retargeted)
        retry.headers.add(name, value)
        retry.headers.set("CSeq", "2 INVITE")
        retry.headers.remove_first("Via")
        retry.headers.prepend("Via", bare._via("udp"))
        response = await asyncio.wait_for(bare.request(retry, running.sip_addr), GUARD)
        assert response.status == 200, response
        # Another URI of ours is still refused (a replay against another resource).
        other = copy.deepcopy(invite)
        other.uri = "sip:someone-else@" + DOMAIN
        _, bad = client.respond(challenge, other)
        probe = copy.deepcopy(retargeted)
        probe.headers.add(name, bad)
        probe.headers.set("CSeq", "3 INVITE")
        probe.headers.remove_first("Via")
        probe.headers.prepend("Via", bare._via("udp"))
        refused = await asyncio.wait_for(bare.request(probe, running.sip_addr), GUARD)
        assert refused.status == 400
    finally:
        await bare.close()


async def test_sdp_origin_is_per_session(running: RunningBroker, devices: list[Device]) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    bob = await open_device(devices, "bob", "127.0.0.4")
    a1 = origin((await alice.call(running)).body)
    b1 = origin((await bob.call(running)).body)
    assert a1[0] != b1[0]  # each session its own sess-id
    assert a1[1] == b1[1] == 1
    assert alice.dialog is not None
    for expected in (2, 3):
        alice.version += 1
        answer = await asyncio.wait_for(alice.ua.reinvite(alice.dialog, alice.offer()), GUARD)
        assert origin(answer.body) == (a1[0], expected)  # RFC 3264 §8: version + 1
    assert bob.dialog is not None
    assert origin(
        (await asyncio.wait_for(bob.ua.reinvite(bob.dialog, bob.offer()), GUARD)).body
    ) == (
        b1[0],
        2,
    )


async def test_unauthenticated_bye_from_elsewhere_does_not_end_the_session(
    running: RunningBroker, devices: list[Device], sink: WaitingSink
) -> None:
    alice = await open_device(devices, "alice", "127.0.0.2")
    await alice.call(running)
    assert alice.dialog is not None
    session = running.endpoint.session_of(ALICE)
    assert session is not None
    # An attacker who learned the dialog's identifiers, with no password.
    attacker = UserAgent(UaConfig(aor=ALICE, timers=TIMERS))
    await attacker.start("127.0.0.9")
    try:
        for method in ("BYE", "INVITE"):
            stolen = copy.copy(alice.dialog)
            stolen.local_seq += 10
            request = stolen.create_request(
                method,
                via=attacker._via("udp"),
                contact=attacker.contact_header(),
                body=alice.offer() if method == "INVITE" else b"",
            )
            if method == "INVITE":
                request.headers.set("Content-Type", "application/sdp")
            response = await asyncio.wait_for(attacker.request(request, running.sip_addr), GUARD)
            assert response.status == 401, method
        assert running.endpoint.session_of(ALICE) == session
        # The owner's own BYE (it answers the challenge) still ends it, CSeq still good.
        bye = await asyncio.wait_for(alice.ua.bye(alice.dialog), GUARD)
        assert bye.status == 200
        await asyncio.wait_for(sink.wait_for("session_ended", ALICE), GUARD)
        assert running.endpoint.session_of(ALICE) is None
    finally:
        await attacker.close()


async def test_unauthenticated_invite_is_challenged_once_and_kept_nowhere(
    running: RunningBroker,
) -> None:
    """Issue 12's probe: a spoofed 330-byte INVITE used to earn 10 retransmitted 401s
    (7.4 KB, 22x) and a 32 s transaction. Now: one 100 and one 401, nothing held."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    port = sock.getsockname()[1]

    def request(method: str, call_id: str) -> bytes:
        return (
            f"{method} {BROKER} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-{call_id}\r\n"
            f"Max-Forwards: 70\r\nFrom: <{ALICE}>;tag=f\r\nTo: <{BROKER}>\r\n"
            f"Call-ID: {call_id}\r\nCSeq: 1 {method}\r\n"
            f"Contact: <sip:alice@127.0.0.1:{port}>\r\nContent-Length: 0\r\n\r\n"
        ).encode()

    try:
        invite = request("INVITE", "probe-invite")
        await loop.sock_sendto(sock, invite, running.sip_addr)
        received: list[bytes] = []
        while len(received) < 2:
            received.append(await asyncio.wait_for(loop.sock_recv(sock, 65536), GUARD))
        assert [r.split(b" ", 2)[1] for r in received] == [b"100", b"401"]
        assert len(running.endpoint.ua.layer.servers) == 0  # nothing kept
        # Timer G would resend the 401 after T1 (0.05 s here), 2 T1, 4 T1...: wait 8 T1
        # of the broker's own clock for the probe's answer, which must come first.
        await asyncio.sleep(8 * 0.05)  # the absence of a resend is what is measured
        await loop.sock_sendto(sock, request("OPTIONS", "sentinel"), running.sip_addr)
        after = await asyncio.wait_for(loop.sock_recv(sock, 65536), GUARD)
        assert b"Call-ID: sentinel" in after
        ratio = sum(map(len, received)) / len(invite)
        print(f"\nchallenge: {len(invite)} B in, {sum(map(len, received))} B out ({ratio:.1f}x)")
        assert ratio < 5
    finally:
        sock.close()
