"""The broker's SIP answers on loopback, with our UA as the device.

- OPTIONS in and out of the session, 501 for an unknown method, Allow naming REGISTER
  only in embedded-registrar mode;
- a retargeted INVITE (Request-URI rewritten to the broker's contact by a proxy) whose
  digest ``uri`` is the broker's AOR is accepted (docs/sip.md, "Digest behind a proxy");
- per-session SDP ``o=``: a sess-id per session, version + 1 per answer in that session;
- an in-dialog BYE or re-INVITE not authenticated as the session's owner changes nothing
  (an unauthenticated BYE from another address does not end the session).
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import socket
from dataclasses import replace

from mdeci.broker.app import RunningBroker
from mdeci.broker.endpoint import remote_aor
from mdeci.broker.media_answer import sess_id
from sip.aio.ua import UaConfig, UserAgent
from sip.auth import DigestClient
from sip.dialog import Dialog
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
    # Inside the session too: an in-dialog OPTIONS is answered 200, not 405.
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


def test_a_dialogs_sess_id_is_derived_and_salted_per_process() -> None:
    """No sess-id is kept per session: each dialog's is derived from its Call-ID and From
    tag under the process's salt (another dialog, or the same after a restart, differs)."""
    salt, other = b"s" * 16, b"t" * 16
    one = sess_id(salt, "call-1", "tag-1")
    assert one == sess_id(salt, "call-1", "tag-1") and 0 <= one < 1 << 47
    assert len({one, sess_id(salt, "call-2", "tag-1"), sess_id(salt, "call-1", "tag-2")}) == 3
    assert sess_id(other, "call-1", "tag-1") != one


def test_a_dialog_names_its_user_by_its_remote_aor() -> None:
    """The Session Manager finds a dialog's session by the dialog's remote AOR."""
    dialog = Dialog("c", "l", "r", "sip:broker@d", "sip:Alice@D;transport=udp", "sip:a@1.2.3.4")
    assert remote_aor(dialog) == "sip:Alice@d"
    assert remote_aor(replace(dialog, remote_uri="tel:+5511")) == ""
    assert remote_aor(replace(dialog, remote_uri="sip:d")) == ""


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
            # As large as the challenge: a smaller request gets no answer at all.
            request.headers.add("Padding", "x" * 600)
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


SDP_OFFER = (
    "v=0\r\no=alice 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=application 41000 UDP/MDECI-RUDP mdeci\r\na=mdeci-kx:" + "A" * 43 + "\r\n"
)


def _unauthenticated(port: int, method: str, call_id: str, *, pad: int = 0) -> bytes:
    """A request with no credentials from 127.0.0.1:``port``, ``pad`` bytes of padding
    more; the INVITE of kind ``INVITE+SDP`` carries an offer."""
    if method == "malformed":  # no From: the broker answers 400 statelessly
        return (
            f"INVITE {BROKER} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-"
            f"{call_id}\r\nCSeq: 1 INVITE\r\n" + ("Padding: " + "x" * pad + "\r\n" if pad else "")
            + "Content-Length: 0\r\n\r\n"
        ).encode()  # fmt: skip
    body = SDP_OFFER if method == "INVITE+SDP" else ""
    verb = method.split("+")[0]
    to = ALICE if verb == "REGISTER" else BROKER
    target = "sip:example.org" if verb == "REGISTER" else BROKER
    lines = [
        f"{verb} {target} SIP/2.0",
        f"Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-{call_id}",
        "Max-Forwards: 70", f"From: <{ALICE}>;tag=f", f"To: <{to}>",
        f"Call-ID: {call_id}", f"CSeq: 1 {verb}",
    ]  # fmt: skip
    if verb in ("INVITE", "REGISTER"):
        lines.append(f"Contact: <sip:alice@127.0.0.1:{port}>")
    if pad:
        lines.append("Padding: " + "x" * pad)
    if body:
        lines.append("Content-Type: application/sdp")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()


async def _answers(
    sock: socket.socket, small: bytes, padded: bytes, tag: bytes, broker: tuple[str, int]
) -> tuple[list[bytes], bytes]:
    """The answers to ``small``, and the one to ``padded`` (the same kind of request,
    sent after it and answered by the same path, after it; ``tag``: in its Via)."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendto(sock, small, broker)
    await loop.sock_sendto(sock, padded, broker)
    got: list[bytes] = []
    while True:
        answer = await asyncio.wait_for(loop.sock_recv(sock, 65536), GUARD)
        if tag in answer:
            return got, answer
        got.append(answer)


async def test_no_unauthenticated_answer_is_larger_than_its_request(
    running: RunningBroker,
) -> None:
    """Over UDP, the answers to a request without credentials, 100 Trying included, are
    at most the request's size: a spoofed source is sent no more than it sent. A request
    too small for its answer gets none; padded (as the agent pads), it gets one, and
    no 100 before a challenge. Nothing is held: no server transaction, no resend."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    port = sock.getsockname()[1]
    figures = []
    try:
        for kind in ("INVITE+SDP", "INVITE", "REGISTER", "OPTIONS", "malformed"):
            small = _unauthenticated(port, kind, f"s{secrets.token_hex(4)}")
            tag = f"p{secrets.token_hex(4)}"
            padded = _unauthenticated(port, kind, tag, pad=700)
            answers, answer = await _answers(sock, small, padded, tag.encode(), running.sip_addr)
            sent = sum(map(len, answers))
            figures.append(
                f"{kind}: {len(small)} B in, {sent} B out ({sent / len(small):.2f}x); "
                f"padded {len(padded)} B in, {len(answer)} B out "
                f"({len(answer) / len(padded):.2f}x, {answer.split(b' ', 2)[1].decode()})"
            )
            assert sent <= len(small), (kind, answers)
            assert b" 100 " not in b"".join(a[:12] for a in answers), (kind, answers)
            assert len(answer) <= len(padded) and not answer.startswith(b"SIP/2.0 100 ")
        kept = [t.method for t in running.endpoint.ua.layer.servers.values()]
        # Only OPTIONS's 200, which a retransmission of it gets again (one for one).
        assert set(kept) <= {"OPTIONS"}, kept
        # Timer G would resend a 401 after T1 (0.05 s here): wait 8 T1, then look.
        await asyncio.sleep(8 * 0.05)  # the absence of a resend is what is measured
        sentinel = _unauthenticated(port, "OPTIONS", "sentinel-last", pad=700)
        await loop.sock_sendto(sock, sentinel, running.sip_addr)
        after = await asyncio.wait_for(loop.sock_recv(sock, 65536), GUARD)
        assert b"sentinel-last" in after
        print("\n" + "\n".join(figures))
    finally:
        sock.close()
