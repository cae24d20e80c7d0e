"""The dialog core (RFC 3261 §12-§15) without sockets, and 2xx retransmission on a fake clock."""

from __future__ import annotations

import pytest

from sip.dialog import Dialog, DialogState, TwoXxRetransmitter
from sip.errors import DialogError
from sip.message import Request, Response, parse_message
from sip.transaction import TimerConfig

INVITE = (
    "INVITE sip:bob@example.org SIP/2.0\r\n"
    "Via: SIP/2.0/UDP 127.0.0.2:5062;branch=z9hG4bKa1\r\n"
    "Record-Route: <sip:p1.example.org;lr>, <sip:p2.example.org;lr>\r\n"
    "From: <sip:alice@example.org>;tag=ftag\r\n"
    "To: <sip:bob@example.org>\r\n"
    "Call-ID: c1@example.org\r\n"
    "CSeq: 7 INVITE\r\n"
    "Contact: <sip:alice@127.0.0.2:5062>\r\n"
    "Content-Length: 0\r\n\r\n"
)
OK = (
    "SIP/2.0 200 OK\r\n"
    "Via: SIP/2.0/UDP 127.0.0.2:5062;branch=z9hG4bKa1\r\n"
    "Record-Route: <sip:p1.example.org;lr>, <sip:p2.example.org;lr>\r\n"
    "From: <sip:alice@example.org>;tag=ftag\r\n"
    "To: <sip:bob@example.org>;tag=ttag\r\n"
    "Call-ID: c1@example.org\r\n"
    "CSeq: 7 INVITE\r\n"
    "Contact: <sip:bob@127.0.0.9:5080>\r\n"
    "Content-Length: 0\r\n\r\n"
)
VIA = "SIP/2.0/UDP 127.0.0.2:5062;branch=z9hG4bKnew"


def req(text: str) -> Request:
    msg = parse_message(text.encode())
    assert isinstance(msg, Request)
    return msg


def resp(text: str) -> Response:
    msg = parse_message(text.encode())
    assert isinstance(msg, Response)
    return msg


def test_uac_dialog_from_2xx() -> None:
    d = Dialog.from_uac(req(INVITE), resp(OK))
    assert d.id == ("c1@example.org", "ftag", "ttag")
    # §12.1.2: the UAC's route set is the Record-Route list reversed.
    assert d.route_set == ("<sip:p2.example.org;lr>", "<sip:p1.example.org;lr>")
    assert d.remote_target == "sip:bob@127.0.0.9:5080"
    assert d.local_seq == 7 and d.remote_seq is None
    bye = d.create_request("BYE", via=VIA)
    assert bye.uri == "sip:bob@127.0.0.9:5080"  # loose routing keeps the target
    assert bye.headers.get_all("Route") == list(d.route_set)
    assert bye.cseq.seq == 8 and bye.to.tag == "ttag" and bye.from_.tag == "ftag"
    assert d.state is DialogState.TERMINATED
    assert d.next_hop().host == "p2.example.org"


def test_uas_dialog_and_cseq_rules() -> None:
    invite = req(INVITE)
    d = Dialog.from_uas(invite, "ttag")
    assert d.id == ("c1@example.org", "ttag", "ftag")
    assert d.route_set == ("<sip:p1.example.org;lr>", "<sip:p2.example.org;lr>")
    assert d.remote_seq == 7
    # A lower CSeq is out of order: 500, and nothing changes (§12.2.2).
    old = req(INVITE.replace("CSeq: 7 INVITE", "CSeq: 6 INFO").replace("INVITE sip", "INFO sip"))
    old.headers.set("To", "<sip:bob@example.org>;tag=ttag")
    with pytest.raises(DialogError) as info:
        d.receive_request(old)
    assert info.value.status == 500 and d.remote_seq == 7
    # A re-INVITE with a new Contact refreshes the target (§12.2.2).
    re = req(INVITE.replace("CSeq: 7", "CSeq: 8").replace("127.0.0.2:5062>", "127.0.0.3:6000>"))
    d.receive_request(re)
    assert d.remote_target == "sip:alice@127.0.0.3:6000" and d.remote_seq == 8
    # A second re-INVITE while the first is being answered: 500 (§14.2).
    again = req(INVITE.replace("CSeq: 7", "CSeq: 9"))
    with pytest.raises(DialogError) as info:
        d.receive_request(again)
    assert info.value.status == 500
    d.answered_invite()
    d.receive_request(again)
    assert d.remote_seq == 9


def test_glare_gives_491() -> None:
    d = Dialog.from_uac(req(INVITE), resp(OK))
    d.create_request("INVITE", via=VIA, contact="<sip:alice@127.0.0.2:5062>", body=b"x")
    assert d.invite_out
    theirs = req(
        INVITE.replace("CSeq: 7", "CSeq: 1")
        .replace("From: <sip:alice@example.org>;tag=ftag", "From: <sip:bob@example.org>;tag=ttag")
        .replace("To: <sip:bob@example.org>", "To: <sip:alice@example.org>;tag=ftag")
    )
    with pytest.raises(DialogError) as info:
        d.receive_request(theirs)
    assert info.value.status == 491 and d.remote_seq is None


def test_strict_router_takes_the_request_uri() -> None:
    d = Dialog.from_uac(req(INVITE), resp(OK.replace(";lr>, <sip:p2.example.org;lr>", ">")))
    bye = d.create_request("BYE", via=VIA)
    assert bye.uri == "sip:p1.example.org"
    assert bye.headers.get_all("Route")[-1] == "<sip:bob@127.0.0.9:5080>"


def test_terminated_dialog_refuses_requests_with_481() -> None:
    d = Dialog.from_uas(req(INVITE), "ttag")
    bye = req(INVITE.replace("INVITE sip", "BYE sip").replace("CSeq: 7 INVITE", "CSeq: 8 BYE"))
    d.receive_request(bye)
    assert d.state is DialogState.TERMINATED
    with pytest.raises(DialogError) as info:
        d.receive_request(bye)
    assert info.value.status == 481


def test_missing_tags_are_refused() -> None:
    with pytest.raises(DialogError):
        Dialog.from_uac(req(INVITE), resp(OK.replace(";tag=ttag", "")))
    with pytest.raises(DialogError):
        Dialog.from_uas(req(INVITE.replace(";tag=ftag", "")), "t")


def test_2xx_retransmission_schedule_until_ack() -> None:
    sent: list[float] = []
    gave_up: list[bool] = []
    clock = [0.0]
    r = TwoXxRetransmitter(
        wire=b"200",
        start=0.0,
        config=TimerConfig(t1=0.5, t2=4.0),
        on_resend=lambda _: sent.append(clock[0]),
        on_give_up=lambda: gave_up.append(True),
    )
    while (t := r.get_timer()) is not None and t < 10:
        clock[0] = t
        r.handle_timer(t)
    # §13.3.1.4: T1, then doubling, capped at T2.
    assert sent == [0.5, 1.5, 3.5, 7.5]
    r.ack_received()
    assert r.get_timer() is None and gave_up == []


def test_2xx_retransmission_gives_up_at_64_t1() -> None:
    gave_up: list[float] = []
    clock = [0.0]
    r = TwoXxRetransmitter(
        wire=b"200",
        start=0.0,
        config=TimerConfig(t1=0.5, t2=4.0),
        on_resend=lambda _: None,
        on_give_up=lambda: gave_up.append(clock[0]),
    )
    while (t := r.get_timer()) is not None:
        clock[0] = t
        r.handle_timer(t)
    assert gave_up == [32.0]
