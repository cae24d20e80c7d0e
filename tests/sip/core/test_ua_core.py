"""The sans-IO UAS core (sip/ua.py): the RFC 3261 answers, without sockets."""

from __future__ import annotations

import pytest

from sip.dialog import Dialog, TwoXxRetransmitter
from sip.errors import SipParseError
from sip.message import Request, make_response, parse_message, serialize
from sip.transaction import TimerConfig
from sip.ua import (
    Answer,
    Cancelled,
    Dispatch,
    Reply,
    UaConfig,
    UasCore,
    answer_address,
    check_request,
    malformed_response,
    stateless_response,
)
from sip.uri import NameAddr

BROKER = UaConfig(aor="sip:broker@example.org", methods=frozenset({"INVITE", "REGISTER"}))
EXTERNAL = UaConfig(aor="sip:broker@example.org", methods=frozenset({"INVITE"}))


def request(
    method: str,
    *,
    uri: str = "sip:broker@example.org",
    cseq: int = 1,
    to_tag: str | None = None,
    branch: str = "z9hG4bK-1",
    call_id: str = "call-1",
    extra: str = "",
    body: str = "",
    cseq_method: str | None = None,
) -> Request:
    to = "<sip:broker@example.org>" + (f";tag={to_tag}" if to_tag else "")
    text = (
        f"{method} {uri} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 192.0.2.7:5060;branch={branch}\r\n"
        "Max-Forwards: 70\r\n"
        "From: <sip:alice@example.org>;tag=a1\r\n"
        f"To: {to}\r\n"
        f"Call-ID: {call_id}\r\n"
        f"CSeq: {cseq} {cseq_method or method}\r\n"
        "Contact: <sip:alice@192.0.2.7:5060>\r\n"
        f"{extra}"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )
    msg = parse_message(text.encode())
    assert isinstance(msg, Request)
    return msg


def confirmed(core: UasCore) -> Dialog:
    dialog = Dialog.from_uas(request("INVITE"), "b1")
    core.dialogs[dialog.id] = dialog
    return dialog


def allow(reply: Reply) -> set[str]:
    value = dict(reply.headers)["Allow"]
    return {m.strip() for m in value.split(",")}


# ------------------------------------------------------------------ Allow per mode


def test_allow_names_only_what_the_mode_handles() -> None:
    assert allow(UasCore(BROKER).options_reply()) == {
        "INVITE", "ACK", "CANCEL", "BYE", "OPTIONS", "REGISTER",
    }  # fmt: skip
    external = allow(UasCore(EXTERNAL).options_reply())
    assert "REGISTER" not in external
    for never in ("UPDATE", "INFO", "MESSAGE"):
        assert never not in external


@pytest.mark.parametrize("config", [BROKER, EXTERNAL])
def test_every_allowed_method_is_served_and_none_else(config: UaConfig) -> None:
    core = UasCore(config)
    allowed = allow(core.options_reply())
    for method in ("INVITE", "REGISTER", "UPDATE", "INFO", "MESSAGE", "SUBSCRIBE", "OPTIONS"):
        decision = core.decide(request(method, branch=f"z9hG4bK-{method}"))
        refused = isinstance(decision, Answer) and decision.reply.status == 405
        assert refused == (method not in allowed), method
        if refused:
            assert isinstance(decision, Answer)
            resp = core.build_response(request(method), decision.reply, tag="t")
            assert resp.headers.get_raw("Allow") == [config.allow]


# ------------------------------------------------------------------ 501, OPTIONS


def test_unknown_method_gets_501_with_allow() -> None:
    core = UasCore(BROKER)
    decision = core.decide(request("FOOBAR"))
    assert isinstance(decision, Answer)
    assert decision.reply.status == 501
    resp = core.build_response(request("FOOBAR"), decision.reply, tag="t")
    assert resp.status == 501 and resp.headers.get_raw("Allow") == [BROKER.allow]


def test_options_outside_a_dialog() -> None:
    decision = UasCore(BROKER).decide(request("OPTIONS"))
    assert isinstance(decision, Answer) and decision.reply.status == 200
    assert dict(decision.reply.headers)["Accept"] == "application/sdp"


def test_out_of_service_answers_new_invites_and_options_but_not_dialogs() -> None:
    core = UasCore(EXTERNAL)
    dialog = confirmed(core)
    core.out_of_service = Reply(503, headers=(("Retry-After", "30"),))
    for method in ("INVITE", "OPTIONS"):
        decision = core.decide(request(method, branch=f"z9hG4bK-{method}", call_id="new"))
        assert isinstance(decision, Answer) and decision.reply.status == 503, method
        assert dict(decision.reply.headers)["Retry-After"] == "30"
    # In-dialog requests still reach the dialog (its BYE, a refresh) while draining.
    inside = core.decide(request("OPTIONS", cseq=2, to_tag="b1"))
    assert isinstance(inside, Answer) and inside.reply.status == 200
    assert inside.dialog is dialog
    bye = core.decide(request("BYE", cseq=3, to_tag="b1"))
    assert isinstance(bye, Answer) and bye.reply.status == 200
    core.out_of_service = None
    back = core.decide(request("OPTIONS", call_id="later"))
    assert isinstance(back, Answer) and back.reply.status == 200


def test_options_inside_a_dialog_is_answered_and_keeps_the_dialog() -> None:
    core = UasCore(EXTERNAL)
    dialog = confirmed(core)
    decision = core.decide(request("OPTIONS", cseq=2, to_tag="b1"))
    assert isinstance(decision, Answer)
    assert decision.reply.status == 200 and decision.dialog is dialog and decision.end is None
    assert allow(decision.reply) == allow(core.options_reply())
    assert dialog.remote_seq == 2


def test_bye_in_dialog_ends_it_and_bye_outside_gets_481() -> None:
    core = UasCore(EXTERNAL)
    dialog = confirmed(core)
    decision = core.decide(request("BYE", cseq=2, to_tag="b1"))
    assert isinstance(decision, Answer) and decision.end == "bye received"
    assert decision.dialog is dialog and decision.reply.status == 200
    outside = core.decide(request("BYE", cseq=2, to_tag="nope"))
    assert isinstance(outside, Answer) and outside.reply.status == 481


# ------------------------------------------------------------------ CANCEL (§9.2)


def test_cancel_of_a_pending_invite_gets_200_then_487() -> None:
    core = UasCore(BROKER)
    invite = request("INVITE", body="v=0\r\n", extra="Content-Type: application/sdp\r\n")
    dispatch = core.decide(invite)
    assert isinstance(dispatch, Dispatch)
    cancel = request("CANCEL", cseq=1)
    decision = core.decide(cancel, invite_exists=True)
    assert isinstance(decision, Cancelled)
    assert decision.invite is invite
    # The application's late answer is discarded: the INVITE already got 487.
    assert core.after_handler(invite, Reply(200, body=b"v=0"), dispatch) is None
    assert core.waiting == 0


def test_cancel_after_the_final_answer_gets_200_without_effect() -> None:
    core = UasCore(BROKER)
    invite = request("INVITE")
    dispatch = core.decide(invite)
    assert isinstance(dispatch, Dispatch)
    assert core.after_handler(invite, Reply(200), dispatch) == Reply(200)
    decision = core.decide(request("CANCEL"), invite_exists=True)
    assert isinstance(decision, Answer) and decision.reply.status == 200


def test_cancel_matching_nothing_gets_481() -> None:
    decision = UasCore(BROKER).decide(request("CANCEL", branch="z9hG4bK-other"))
    assert isinstance(decision, Answer) and decision.reply.status == 481


# ------------------------------------------------------------------ stateless answers


def test_400_carries_a_to_tag_and_a_warning() -> None:
    raw = (
        b"INVITE sip:broker@example.org SIP/2.0\r\n"
        b"Via: SIP/2.0/UDP 192.0.2.7;branch=z9hG4bK-x\r\n"
        b"From: <sip:alice@example.org>;tag=a\r\nTo: <sip:broker@example.org>\r\n"
        b"Call-ID: c\r\nCSeq: 1 INVITE\r\nMax-Forwards: bad\r\n\r\n"
    )
    with pytest.raises(SipParseError) as info:
        parse_message(raw)
    response = malformed_response(info.value, "tag400")
    assert response is not None and response.status == 400
    assert NameAddr.parse(response.headers.get("To") or "").tag == "tag400"
    assert "Max-Forwards" in (response.headers.get("Warning") or "")


def test_stateless_refusal_has_a_to_tag() -> None:
    response = stateless_response(request("OPTIONS"), 503, "busy", "t9")
    assert response is not None
    assert NameAddr.parse(response.headers.get("To") or "").tag == "t9"


def test_sips_over_a_non_tls_transport_gets_416() -> None:
    sips = request("INVITE", uri="sips:broker@example.org")
    assert check_request(sips, "udp") == (416, "sips: Request-URI over a non-TLS transport")
    assert check_request(sips, "tcp") is not None
    assert check_request(sips, "tls") is None
    assert check_request(request("INVITE"), "udp") is None


def test_cseq_method_mismatch_gets_400() -> None:
    # parse_message refuses it too; check_request guards messages built in code.
    msg = request("OPTIONS")
    msg.headers.set("CSeq", "1 INVITE")
    problem = check_request(msg, "udp")
    assert problem is not None and problem[0] == 400


# ------------------------------------------------------------------ guard


def test_guard_refusal_changes_nothing_in_the_dialog() -> None:
    core = UasCore(EXTERNAL, guard=lambda msg, dialog, source: Reply(401))
    dialog = confirmed(core)
    before = (dialog.remote_seq, dialog.remote_target, dialog.state)
    for method in ("BYE", "INVITE"):
        decision = core.decide(request(method, cseq=9, to_tag="b1"))
        assert isinstance(decision, Answer) and decision.reply.status == 401
        assert decision.end is None
    assert (dialog.remote_seq, dialog.remote_target, dialog.state) == before


def test_refused_reinvite_restores_the_target() -> None:
    core = UasCore(EXTERNAL)
    dialog = confirmed(core)
    target = dialog.remote_target
    reinvite = request("INVITE", cseq=2, to_tag="b1", branch="z9hG4bK-2")
    reinvite.headers.set("Contact", "<sip:alice@198.51.100.1:5060>")
    dispatch = core.decide(reinvite)
    assert isinstance(dispatch, Dispatch)
    assert dialog.remote_target != target
    core.after_handler(reinvite, Reply(488), dispatch)
    assert dialog.remote_target == target
    assert not dialog.invite_in


def test_require_with_an_unknown_extension_gets_420() -> None:
    decision = UasCore(BROKER).decide(request("INVITE", extra="Require: 100rel\r\n"))
    assert isinstance(decision, Answer) and decision.reply.status == 420
    assert dict(decision.reply.headers)["Unsupported"] == "100rel"


# ------------------------------------------------------------------ before a transaction


def test_screen_lets_a_good_request_in() -> None:
    core = UasCore(BROKER)
    assert core.screen(request("OPTIONS"), "udp", lambda: "t1") is None


def test_screen_refuses_a_bad_request_with_400_and_counts_it() -> None:
    core = UasCore(BROKER)
    msg = request("OPTIONS")
    msg.headers.set("CSeq", "1 INVITE")
    refusal = core.screen(msg, "udp", lambda: "t1")
    assert refusal is not None and refusal.response is not None
    assert refusal.response.status == 400
    assert refusal.response.to.tag == "t1"
    assert core.stats.answered_400 == 1


def test_screen_caps_a_busy_source_with_503_and_retry_after() -> None:
    core = UasCore(UaConfig(aor="sip:broker@example.org", max_open_per_source=2))
    msg = request("OPTIONS")
    assert core.screen(msg, "udp", lambda: "t", busy=1) is None
    refusal = core.screen(msg, "udp", lambda: "t", busy=2)
    assert refusal is not None and refusal.response is not None
    assert refusal.response.status == 503
    assert refusal.response.headers.get("Retry-After") == "5"
    assert core.stats.over_cap == 1
    # A retransmission of a request already held still reaches its transaction.
    assert core.screen(msg, "udp", lambda: "t", busy=2, retransmission=lambda _: True) is None


def test_malformed_request_gets_400_and_is_counted() -> None:
    core = UasCore(BROKER)
    data = serialize(request("OPTIONS")).replace(b"CSeq: 1 OPTIONS", b"CSeq: x OPTIONS")
    with pytest.raises(SipParseError) as caught:
        parse_message(data)
    response = core.malformed(caught.value, "t1")
    assert response is not None and response.status == 400
    assert core.stats.answered_400 == 1


# ------------------------------------------------------------------ answering INVITE


def test_answer_goes_to_the_source_with_rport_or_over_a_stream() -> None:
    msg = request("INVITE")
    response = make_response(msg, 200)
    assert answer_address(response, ("198.51.100.1", 4000), "udp") == ("192.0.2.7", 5060)
    assert answer_address(response, ("198.51.100.1", 4000), "tcp") == ("198.51.100.1", 4000)
    msg.headers.set("Via", "SIP/2.0/UDP 192.0.2.7:5060;branch=z9hG4bK-1;rport=4000")
    rport = make_response(msg, 200)
    assert answer_address(rport, ("198.51.100.1", 4000), "udp") == ("198.51.100.1", 4000)


def test_new_dialog_is_held_and_an_unusable_invite_gets_400() -> None:
    core = UasCore(BROKER)
    made = core.new_dialog(request("INVITE"), "b1")
    assert isinstance(made, Dialog) and core.dialogs[made.id] is made
    broken = request("INVITE")
    broken.headers.remove("Contact")
    refused = core.new_dialog(broken, "b2")
    assert isinstance(refused, Reply) and refused.status == 400


def test_accepted_invite_over_a_stream_records_the_flow() -> None:
    core = UasCore(BROKER)
    made = core.new_dialog(request("INVITE"), "b1")
    assert isinstance(made, Dialog)
    response = make_response(request("INVITE"), 200, to_tag="b1")
    assert core.accepted(made, response, ("198.51.100.1", 4000), "tcp") is None
    record = core.dialogs.record(made.id)
    assert record is not None and record.flow == ("tcp", ("198.51.100.1", 4000))
    assert core.accepted(made, response, ("198.51.100.1", 4000), "udp") == ("192.0.2.7", 5060)
    assert record.flow is None


def test_ack_stops_the_2xx_retransmission_and_confirms_once() -> None:
    core = UasCore(BROKER)
    made = core.new_dialog(request("INVITE"), "b1")
    assert isinstance(made, Dialog)
    record = core.dialogs.record(made.id)
    assert record is not None
    resent: list[bytes] = []
    retransmitter = TwoXxRetransmitter(
        b"2xx", 0.0, TimerConfig(), on_resend=resent.append, on_give_up=lambda: None
    )
    core.dialogs.retransmit(made.id, retransmitter)
    assert core.dialogs.retransmitting() == [retransmitter]
    ack = request("ACK", to_tag="b1")
    assert core.acked(ack) is made
    assert retransmitter.get_timer() is None  # stopped
    assert core.dialogs.retransmitting() == []
    # Nothing is kept beside the dialog now: it is held bare (a broker holds thousands).
    assert core.dialogs._records[made.id] is made
    retransmitter.handle_timer(10.0)
    assert resent == []
    assert core.acked(ack) is None  # a repeated ACK confirms nothing more


def test_respond_uses_the_via_transport_for_the_contact() -> None:
    core = UasCore(BROKER)
    msg = request("INVITE")
    msg.headers.set("Via", "SIP/2.0/TCP 192.0.2.7:5060;branch=z9hG4bK-1")
    response = core.respond(msg, Reply(200), tag="b1", contact=lambda t: f"<sip:b@h;t={t}>")
    assert response is not None
    assert response.headers.get("Contact") == "<sip:b@h;t=tcp>"
    assert response.to.tag == "b1"
