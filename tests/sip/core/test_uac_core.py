"""The sans-IO UAC core (sip/uac.py) against the sans-IO registrar and UAS cores, on a
fake clock, without sockets: REGISTER, digest retry, refresh and removal; INVITE, ACK,
the ACK re-sent for a retransmitted 2xx; CANCEL."""

from __future__ import annotations

import random as _random

import pytest

from sip.auth import DigestConfig, DigestServer, MemoryCredentialStore
from sip.dialog import Dialog
from sip.message import Request, Response, make_response, parse_message, serialize
from sip.registrar import MemoryBindingStore, Registrar, RegistrarConfig
from sip.transaction import transaction_key
from sip.ua import DialogTable, Reply, UaConfig, UasCore
from sip.uac import (
    DialogCreated,
    Refused,
    Registered,
    UacCore,
    Unregistered,
    build_cancel,
    dialog_dest,
    granted_expires,
    refresh_delay,
)

HERE = ("192.0.2.1", 5060)
REGISTRAR = ("192.0.2.9", 5060)
OTHER_REGISTRAR = ("192.0.2.10", 5060)
BOB = ("192.0.2.20", 5062)


def source(seed: int) -> _random.Random:
    return _random.Random(seed)


def alice(password: str | None = None, **kw: object) -> UacCore:
    config = UaConfig(aor="sip:alice@example.org", password=password, **kw)  # type: ignore[arg-type]
    core = UacCore(config, DialogTable(), source(1).randbytes)
    core.local = HERE
    return core


def registrar(auth: bool = False, seed: int = 2) -> Registrar:
    """``seed`` draws the Digest server's nonce secret."""
    digest = None
    if auth:
        store = MemoryCredentialStore()
        store.add_password("alice", "example.org", "secret")
        digest = DigestServer(DigestConfig(realm="example.org"), store, source(seed).randbytes)
    config = RegistrarConfig(domains=("example.org",), max_expires=3600)
    return Registrar(config, MemoryBindingStore(), source(3).randbytes, auth=digest)


def wire(msg: Request | Response) -> Request | Response:
    """The message as the peer reads it off the wire."""
    return parse_message(serialize(msg))


def ask(server: Registrar, request: Request, now: float) -> Response:
    got = wire(request)
    assert isinstance(got, Request)
    response = wire(server.handle(got, now, source="192.0.2.1:5060"))
    assert isinstance(response, Response)
    return response


def branch(msg: Request) -> str:
    return msg.top_via.branch or ""


# ---------------------------------------------------------------- registration


def test_register_request_names_aor_contact_expires_and_rport() -> None:
    core = alice()
    reg, request = core.register_request(REGISTRAR, 600, "udp")
    assert request.method == "REGISTER"
    assert request.uri == "sip:example.org"
    assert request.to.uri.user == "alice"  # type: ignore[union-attr]
    assert request.from_.tag
    assert request.headers.get("Contact") == "<sip:alice@192.0.2.1:5060>"
    assert request.headers.get("Expires") == "600"
    assert "rport" in request.top_via.params
    assert branch(request).startswith("z9hG4bK")
    assert (request.call_id, request.cseq.seq) == (reg.call_id, 1)


def test_register_refreshes_share_call_id_with_rising_cseq() -> None:
    core, server = alice(), registrar()
    seen: list[tuple[str, int, str]] = []
    now = 0.0
    for _ in range(3):
        reg, request = core.register_request(REGISTRAR, 600, "udp")
        result = core.register_answered(reg, ask(server, request, now), now)
        assert isinstance(result, Registered)
        seen.append((request.call_id, request.cseq.seq, branch(request)))
        now = result.refresh_at
    assert len({call_id for call_id, _, _ in seen}) == 1
    assert [cseq for _, cseq, _ in seen] == [1, 2, 3]
    assert len({b for _, _, b in seen}) == 3  # every REGISTER is a new transaction


def test_registered_at_granted_interval_and_refreshed_before_expiry() -> None:
    core, server = alice(), registrar()
    reg, request = core.register_request(REGISTRAR, 7200, "udp")
    result = core.register_answered(reg, ask(server, request, 100.0), 100.0)
    assert isinstance(result, Registered)
    assert result.granted == 3600  # the registrar's max_expires
    assert result.refresh_at == 100.0 + 3600 - 60
    assert core.registration is reg and reg.granted == 3600


@pytest.mark.parametrize(
    ("granted", "delay"), [(1, 1.0), (2, 1.0), (60, 30.0), (120, 60.0), (600, 540.0)]
)
def test_refresh_delay_is_half_the_interval_at_most_a_minute_ahead(
    granted: int, delay: float
) -> None:
    assert refresh_delay(granted) == delay


def test_granted_expires_prefers_our_contact_then_header_then_asked() -> None:
    core = alice()
    _, request = core.register_request(REGISTRAR, 600, "udp")
    response = make_response(request, 200)
    assert granted_expires(response, 600, core.contact_uri) == 600
    response.headers.add("Expires", "300")
    assert granted_expires(response, 600, core.contact_uri) == 300
    response.headers.add("Contact", "<sip:alice@192.0.2.99:5060>;expires=10")
    response.headers.add("Contact", "<sip:alice@192.0.2.1:5060>;expires=120")
    assert granted_expires(response, 600, core.contact_uri) == 120


def test_digest_retry_has_credentials_next_cseq_and_a_new_branch() -> None:
    core, server = alice(password="secret"), registrar(auth=True)
    reg, request = core.register_request(REGISTRAR, 600, "udp")
    challenge = ask(server, request, 0.0)
    assert challenge.status == 401
    retry = core.retry(request, challenge, "udp")
    assert retry is not None
    assert retry.cseq.seq == request.cseq.seq + 1
    assert retry.call_id == request.call_id
    assert branch(retry) != branch(request)
    assert (retry.headers.get("Authorization") or "").startswith("Digest ")
    answer = ask(server, retry, 0.0)
    assert answer.status == 200
    assert isinstance(core.register_answered(reg, answer, 0.0), Registered)
    # The next REGISTER follows the retry's CSeq.
    _, refresh = core.register_request(REGISTRAR, 600, "udp")
    assert refresh.cseq.seq == retry.cseq.seq + 1


def test_after_a_challenge_new_requests_carry_credentials_ahead() -> None:
    """The refresh goes through without a challenge (one round trip, not two), padded
    as any new request over UDP; the INVITE to the same realm carries them too."""
    core, server = alice(password="secret"), registrar(auth=True)
    reg, request = core.register_request(REGISTRAR, 600, "udp")
    assert "Authorization" not in request.headers  # nothing to answer yet
    retry = core.retry(request, ask(server, request, 0.0), "udp")
    assert retry is not None and "Padding" not in retry.headers
    assert isinstance(core.register_answered(reg, ask(server, retry, 0.0), 0.0), Registered)
    reg, refresh = core.register_request(REGISTRAR, 600, "udp")
    assert "nc=00000002" in (refresh.headers.get("Authorization") or "")
    assert len(serialize(refresh)) == core.config.pad_to
    assert isinstance(core.register_answered(reg, ask(server, refresh, 1.0), 1.0), Registered)
    invite = core.build_request("INVITE", "sip:broker@example.org", to="<sip:broker@example.org>")
    assert "nc=00000003" in (invite.headers.get("Authorization") or "")
    ack = core.build_request("ACK", "sip:broker@example.org", to="<sip:broker@example.org>")
    assert "Authorization" not in ack.headers


def test_credentials_ahead_that_a_server_forgot_are_retried_once() -> None:
    """A restarted registrar (new nonce secret) refuses the nonce sent ahead as stale:
    the client answers the fresh challenge and is registered."""
    core, server = alice(password="secret"), registrar(auth=True)
    reg, request = core.register_request(REGISTRAR, 600, "udp")
    retry = core.retry(request, ask(server, request, 0.0), "udp")
    assert retry is not None
    assert isinstance(core.register_answered(reg, ask(server, retry, 0.0), 0.0), Registered)
    restarted = registrar(auth=True, seed=5)  # another nonce secret
    reg, refresh = core.register_request(REGISTRAR, 600, "udp")
    challenge = ask(restarted, refresh, 1.0)
    assert challenge.status == 401
    assert "stale=true" in (challenge.headers.get("WWW-Authenticate") or "")
    again = core.retry(refresh, challenge, "udp")
    assert again is not None
    assert isinstance(core.register_answered(reg, ask(restarted, again, 1.0), 1.0), Registered)


def test_digest_retry_gives_up_on_wrong_password() -> None:
    core, server = alice(password="wrong"), registrar(auth=True)
    reg, request = core.register_request(REGISTRAR, 600, "udp")
    retry = core.retry(request, ask(server, request, 0.0), "udp")
    assert retry is not None
    refused = ask(server, retry, 0.0)
    assert refused.status in (401, 403)
    core.retry_answered(refused)
    _, again = core.register_request(REGISTRAR, 600, "udp")
    assert "Authorization" not in again.headers  # no refused password sent ahead
    assert core.retry(retry, refused, "udp") is None  # the same credentials are refused
    result = core.register_answered(reg, refused, 0.0)
    assert isinstance(result, Refused) and result.status == refused.status
    assert core.registration is None


def test_no_retry_without_credentials_or_challenge() -> None:
    core, server = alice(), registrar(auth=True)
    _, request = core.register_request(REGISTRAR, 600, "udp")
    assert core.retry(request, ask(server, request, 0.0), "udp") is None
    assert alice(password="secret").retry(request, make_response(request, 403), "udp") is None


def test_unregister_ends_the_registration() -> None:
    core, server = alice(), registrar()
    reg, request = core.register_request(REGISTRAR, 600, "udp")
    core.register_answered(reg, ask(server, request, 0.0), 0.0)
    reg, request = core.register_request(REGISTRAR, 0, "udp")
    assert request.headers.get("Expires") == "0"
    assert isinstance(core.register_answered(reg, ask(server, request, 1.0), 1.0), Unregistered)
    assert core.registration is None
    assert server.lookup("sip:alice@example.org", 1.0) == []


def test_register_removes_an_old_contact_in_the_same_request() -> None:
    core, server = alice(), registrar()
    reg, request = core.register_request(REGISTRAR, 600, "udp")
    core.register_answered(reg, ask(server, request, 0.0), 0.0)
    old = core.contact_header()
    core.local = ("192.0.2.2", 5070)  # moved
    reg, request = core.register_request(REGISTRAR, 600, "udp", remove=old)
    assert request.headers.get_all("Contact") == [
        "<sip:alice@192.0.2.2:5070>",
        "<sip:alice@192.0.2.1:5060>;expires=0",
    ]
    assert isinstance(core.register_answered(reg, ask(server, request, 1.0), 1.0), Registered)
    contacts = [b.contact for b in server.lookup("sip:alice@example.org", 1.0)]
    assert contacts == ["sip:alice@192.0.2.2:5070"]


def test_refused_register_keeps_the_current_registration() -> None:
    core, server = alice(), registrar()
    reg, request = core.register_request(REGISTRAR, 600, "udp")
    core.register_answered(reg, ask(server, request, 0.0), 0.0)
    other, request = core.register_request(OTHER_REGISTRAR, 600, "udp")
    assert other is not reg and other.call_id != reg.call_id  # a new registrar: new Call-ID
    result = core.register_answered(other, make_response(request, 503), 1.0)
    assert isinstance(result, Refused) and result.status == 503
    assert core.registration is reg


def test_large_request_goes_over_tcp_with_its_via_rewritten() -> None:
    core = alice()
    request = core.build_request("MESSAGE", "sip:bob@example.org", to="<sip:bob@example.org>")
    assert core.transport_for(request, "udp") == "udp"
    big = core.build_request(
        "MESSAGE", "sip:bob@example.org", to="<sip:bob@example.org>", body=b"x" * 1400
    )
    assert core.transport_for(big, "udp") == "tcp"
    assert big.top_via.transport == "TCP"
    no_tcp = alice(tcp=False)
    big = no_tcp.build_request(
        "MESSAGE", "sip:bob@example.org", to="<sip:bob@example.org>", body=b"x" * 1400
    )
    assert no_tcp.transport_for(big, "udp") == "udp"


def test_a_request_without_credentials_is_padded_over_udp_only() -> None:
    core = alice()
    to = "<sip:bob@example.org>"
    udp = core.build_request("REGISTER", "sip:example.org", to=to)
    assert len(serialize(udp)) == core.config.pad_to and udp.headers.get("Padding")
    tcp = core.build_request("REGISTER", "sip:example.org", to=to, transport="tcp")
    assert "Padding" not in tcp.headers and len(serialize(tcp)) < 500
    unpadded = alice(pad_to=0).build_request("REGISTER", "sip:example.org", to=to)
    assert "Padding" not in unpadded.headers


# ---------------------------------------------------------------- INVITE


def bob_answers(invite: Request, status: int = 200, tag: str = "b1") -> Response:
    """Bob's UAS core answers ``invite`` (Contact at BOB)."""
    got = wire(invite)
    assert isinstance(got, Request)
    bob = UasCore(UaConfig(aor="sip:bob@example.org"))
    response = bob.build_response(
        got, Reply(status), tag=tag, contact=f"<sip:bob@{BOB[0]}:{BOB[1]}>"
    )
    answer = wire(response)
    assert isinstance(answer, Response)
    return answer


def invite(core: UacCore) -> Request:
    return core.build_request(
        "INVITE", "sip:bob@example.org", to="<sip:bob@example.org>", body=b"v=0\r\n"
    )


def test_2xx_makes_the_dialog_and_its_ack() -> None:
    core = alice()
    request = invite(core)
    result = core.invite_answered(request, bob_answers(request), "udp")
    assert isinstance(result, DialogCreated)
    dialog = result.dialog
    assert core.dialogs[dialog.id] is dialog
    assert (dialog.local_tag, dialog.remote_tag) == (request.from_.tag, "b1")
    ack = parse_message(result.ack.wire)
    assert isinstance(ack, Request) and ack.method == "ACK"
    assert (ack.cseq.seq, ack.cseq.method) == (request.cseq.seq, "ACK")
    assert branch(ack) != branch(request)  # §13.2.2.4: its own transaction
    assert ack.uri == f"sip:bob@{BOB[0]}:{BOB[1]}"
    assert result.ack.dest == BOB == dialog_dest(dialog)


def test_retransmitted_2xx_gets_the_same_ack_again() -> None:
    core = alice()
    request = invite(core)
    answer = bob_answers(request)
    result = core.invite_answered(request, answer, "udp")
    assert isinstance(result, DialogCreated)
    assert core.reack(answer) == result.ack
    assert core.reack(bob_answers(request, tag="other-fork")) is None
    del core.dialogs[result.dialog.id]
    assert core.reack(answer) is None  # the dialog is over: nothing to re-send


@pytest.mark.parametrize("status", [300, 404, 486, 603])
def test_final_non_2xx_refuses_the_invite(status: int) -> None:
    core = alice()
    request = invite(core)
    result = core.invite_answered(request, bob_answers(request, status), "udp")
    assert result == Refused(status, bob_answers(request, status).reason)
    assert len(core.dialogs) == 0


def test_2xx_without_contact_is_a_bad_gateway() -> None:
    core = alice()
    request = invite(core)
    answer = bob_answers(request)
    answer.headers.remove("Contact")
    result = core.invite_answered(request, answer, "udp")
    assert isinstance(result, Refused) and result.status == 502
    assert len(core.dialogs) == 0


def test_reinvite_2xx_is_acked_at_the_new_target() -> None:
    core = alice()
    request = invite(core)
    result = core.invite_answered(request, bob_answers(request), "udp")
    assert isinstance(result, DialogCreated)
    dialog = result.dialog
    again = core.in_dialog_request(dialog, "INVITE", "udp", b"v=0\r\n")
    assert again.cseq.seq == request.cseq.seq + 1
    answer = bob_answers(again)
    answer.headers.set("Contact", "<sip:bob@192.0.2.21:5064>")
    assert core.in_dialog_answered(dialog, again, wire(answer)) is True  # type: ignore[arg-type]
    ack = core.ack(dialog, answer, "udp", dialog_dest(dialog))
    assert ack.dest == ("192.0.2.21", 5064)
    assert core.reack(answer) == ack
    bye = core.in_dialog_request(dialog, "BYE", "udp")
    assert core.in_dialog_answered(dialog, bye, make_response(bye, 200)) is False


def test_cancel_matches_the_invite_transaction_at_the_next_hop() -> None:
    core = alice()
    request = invite(core)
    request.headers.add("Route", "<sip:proxy.example.org;lr>")
    cancel = build_cancel(request)
    assert cancel.method == "CANCEL" and cancel.uri == request.uri
    assert (cancel.cseq.seq, cancel.cseq.method) == (request.cseq.seq, "CANCEL")
    for name in ("From", "To", "Call-ID", "Route"):
        assert cancel.headers.get(name) == request.headers.get(name)
    assert cancel.headers.get_all("Via") == [request.headers.get("Via")]
    got = wire(cancel)
    assert isinstance(got, Request)
    branch_, sent_by, _ = transaction_key(got)
    assert (branch_, sent_by, "INVITE") == transaction_key(request)


def test_cancel_of_a_waiting_invite_is_answered_by_the_uas_core() -> None:
    core = alice()
    request = invite(core)
    got = wire(request)
    assert isinstance(got, Request)
    bob = UasCore(UaConfig(aor="sip:bob@example.org"))
    bob.decide(got)
    cancel = wire(build_cancel(request))
    assert isinstance(cancel, Request)
    decided = bob.decide(cancel)
    assert type(decided).__name__ == "Cancelled"
    assert bob.waiting == 0


def test_contact_names_the_transport() -> None:
    core = alice()
    core.tls_local = ("192.0.2.1", 5061)
    assert core.contact_header("udp") == "<sip:alice@192.0.2.1:5060>"
    assert core.contact_header("tcp") == "<sip:alice@192.0.2.1:5060;transport=tcp>"
    assert core.contact_header("tls") == "<sips:alice@192.0.2.1:5061>"
    assert "192.0.2.1:5061" in core.via("tls") and core.via("tls").startswith("SIP/2.0/TLS")


def test_uac_dialog_is_in_the_table_the_uas_core_reads() -> None:
    table = DialogTable()
    uas = UasCore(UaConfig(aor="sip:alice@example.org"), dialogs=table)
    core = UacCore(UaConfig(aor="sip:alice@example.org"), table, source(1).randbytes)
    core.local = HERE
    request = invite(core)
    result = core.invite_answered(request, bob_answers(request), "udp")
    assert isinstance(result, DialogCreated)
    bye = wire(
        Dialog.from_uas(request, "b1").create_request("BYE", via="SIP/2.0/UDP x;branch=z9hG4bK-b")
    )
    assert isinstance(bye, Request)
    assert uas.find_dialog(bye) is result.dialog
