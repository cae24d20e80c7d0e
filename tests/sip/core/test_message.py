"""Message layer: RFC 4475-style torture cases (written here), round trips, framing, fuzzing."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sip.errors import SipParseError
from sip.headers import TOKEN_CHARS, is_token, split_list
from sip.message import (
    CSeq,
    Headers,
    NameAddr,
    Request,
    Response,
    SipUri,
    StreamFramer,
    TelUri,
    Via,
    make_response,
    parse_message,
    serialize,
)
from sip.uri import AbsoluteUri, parse_uri

CRLF = "\r\n"


def msg(*lines: str, body: str = "") -> bytes:
    return (CRLF.join(lines) + CRLF + CRLF + body).encode()


BASIC = [
    "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK-1",
    "Max-Forwards: 70",
    "From: <sip:alice@example.org>;tag=a1",
    "To: <sip:bob@example.org>",
    "Call-ID: c1@192.0.2.1",
]

REGISTER = msg(
    "REGISTER sip:example.org SIP/2.0",
    "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bKnashds7;rport",
    "Max-Forwards: 70",
    "To: Bob <sip:bob@example.org>",
    "From: Bob <sip:bob@example.org>;tag=456248",
    "Call-ID: 843817637684230@998sdasdh09",
    "CSeq: 1826 REGISTER",
    "Contact: <sip:bob@192.0.2.4>",
    "Expires: 7200",
    "Content-Length: 0",
)


def test_compact_forms_folding_and_lists() -> None:
    # RFC 4475 §3.1.1.1 in spirit: compact names, folded values, odd spacing.
    raw = msg(
        "INVITE sip:vivekg@chair-dnrc.example.com;unknownparam SIP/2.0",
        "v:  SIP/2.0/UDP   192.0.2.2;branch=z9hG4bK-a",
        "    ;received=192.0.2.99,",
        "  SIP/2.0/TCP 192.0.2.3:5070 ; branch=z9hG4bK-b",
        "t:",
        "    <sip:vivekg@chair-dnrc.example.com>;tag=1918181833n",
        'f: "J Rosenberg \\\\\\"" <sip:jdrosen@example.com>',
        "  ;",
        "  tag = 98asjd8",
        "i: 0ha0isndaksdj@192.0.2.1",
        "CSeq: 8   INVITE",
        "m: <sip:a@h1>;q=0.2, sip:b@h2;expires=30",
        "Max-Forwards: 68",
        "c: application/sdp",
        "l: 3",
        body="abc",
    )
    m = parse_message(raw)
    assert isinstance(m, Request)
    assert m.method == "INVITE"
    vias = [Via.parse(v) for v in m.headers.get_all("via")]
    assert [v.branch for v in vias] == ["z9hG4bK-a", "z9hG4bK-b"]
    assert vias[0].received == "192.0.2.99"
    assert vias[1].transport == "TCP" and vias[1].port == 5070
    assert m.to.tag == "1918181833n"
    frm = m.from_
    assert frm.display_name == 'J Rosenberg \\"'
    assert frm.tag == "98asjd8"
    assert m.cseq == CSeq(8, "INVITE")
    contacts = [NameAddr.parse(c) for c in m.headers.get_all("Contact")]
    assert [c.q for c in contacts] == [0.2, 1.0]
    assert contacts[1].expires == 30
    assert m.headers.get("Content-Type") == "application/sdp"
    assert m.body == b"abc"
    assert parse_message(serialize(m)) == m


def test_escaped_uris_and_params() -> None:
    uri = SipUri.parse(
        "sip:sips%3Auser%40example.com@example.net;lr;maddr=[::1]?Subject=hi%20there&x=1"
    )
    assert uri.user == "sips:user@example.com"
    assert uri.host == "example.net"
    assert uri.params == {"lr": None, "maddr": "[::1]"}
    assert uri.headers == {"Subject": "hi there", "x": "1"}
    assert SipUri.parse(str(uri)) == uri
    v6 = SipUri.parse("sips:alice:secret@[2001:db8::10]:5061;transport=tcp")
    assert (v6.host, v6.port, v6.password, v6.transport, v6.scheme) == (
        "[2001:db8::10]",
        5061,
        "secret",
        "tcp",
        "sips",
    )
    tel = parse_uri("tel:+1-201-555-0123;phone-context=example.com")
    assert isinstance(tel, TelUri) and tel.number == "+1-201-555-0123"
    assert str(tel) == "tel:+1-201-555-0123;phone-context=example.com"
    assert isinstance(parse_uri("urn:uuid:f81d4fae"), AbsoluteUri)
    assert SipUri.parse("sip:Bob@Example.ORG:5060;x").aor == "sip:Bob@example.org"


@pytest.mark.parametrize(
    "text",
    [
        "sip:",
        "sip:user@",
        "sip:@host",
        "sip:host:99999",
        "sip:host:12a",
        "sip:user@[::1",
        "sip:a%4@host",
        "sip:host;=x",
        "http//x",
        "sip:ho st",
    ],
)
def test_bad_uris(text: str) -> None:
    with pytest.raises(SipParseError):
        parse_uri(text)


def test_name_addr_forms() -> None:
    a = NameAddr.parse("sip:alice@h;tag=x")  # addr-spec: params belong to the header
    assert a.params == {"tag": "x"} and isinstance(a.uri, SipUri) and a.uri.params == {}
    b = NameAddr.parse("Alice Smith <sip:alice@h;transport=tcp>;tag=y")
    assert b.display_name == "Alice Smith"
    assert isinstance(b.uri, SipUri) and b.uri.params == {"transport": "tcp"}
    c = NameAddr.parse('"\\"quoted\\"" <tel:+331>')
    assert c.display_name == '"quoted"' and isinstance(c.uri, TelUri)
    for d in (a, b, c):
        assert NameAddr.parse(str(d)) == NameAddr(
            uri=d.uri, display_name=d.display_name, params=d.params
        )
    for bad in ['"unterminated <sip:a@h>', "<sip:a@h", "Bad,Name <sip:a@h>", "", "sip:a@h?x=y"]:
        with pytest.raises(SipParseError):
            NameAddr.parse(bad)


def test_via_rport_received() -> None:
    via = Via.parse("SIP/2.0/UDP client.example.com:5060;branch=z9hG4bK123;rport")
    assert via.params.get("rport", "absent") is None
    via.stamp("192.0.2.7", 49152)
    assert via.received == "192.0.2.7" and via.rport == 49152
    assert via.response_address() == ("192.0.2.7", 49152)
    assert str(via) == (
        "SIP/2.0/UDP client.example.com:5060;branch=z9hG4bK123;rport=49152;received=192.0.2.7"
    )
    plain = Via.parse("SIP / 2.0 / UDP 192.0.2.1 : 5062 ;branch=z9hG4bKa")
    plain.stamp("192.0.2.1", 40000)
    assert plain.received is None and plain.response_address() == ("192.0.2.1", 5062)
    # A received the sender wrote itself is not where answers go: the source replaces it.
    forged = Via.parse("SIP/2.0/UDP 192.0.2.1:5062;branch=z9hG4bKc;received=203.0.113.9")
    forged.stamp("192.0.2.1", 40000)
    assert forged.response_address() == ("192.0.2.1", 5062)
    v6 = Via.parse("SIP/2.0/TCP [2001:db8::1];branch=z9hG4bKb")
    assert v6.response_address() == ("2001:db8::1", 5060)
    for bad in ["SIP/2.0 host", "SIP/2.0/UDP", "SIP/2.0/UDP h;branch=", "SIP/2.0/UDP h;rport=x"]:
        with pytest.raises(SipParseError):
            Via.parse(bad)


def test_response_parse_and_make_response() -> None:
    req = parse_message(REGISTER)
    assert isinstance(req, Request)
    resp = make_response(req, 200, to_tag="srv1")
    assert resp.to.tag == "srv1" and resp.reason == "OK"
    data = serialize(resp)
    back = parse_message(data)
    assert isinstance(back, Response) and back.status == 200
    assert [h for h in back.headers if h[0] != "Content-Length"] == list(resp.headers)
    assert parse_message(serialize(back)) == back
    assert back.headers.get("Content-Length") == "0"
    empty_reason = parse_message(data.replace(b"200 OK", b"200 "))
    assert isinstance(empty_reason, Response) and empty_reason.reason == ""


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b"", "empty"),
        (b"INVITE sip:a@b SIP/2.0\r\n", "no empty line"),
        (msg("INVITE sip:a@b SIP/3.0", *BASIC, "CSeq: 1 INVITE"), "version"),
        (msg("INVITE  sip:a@b SIP/2.0", *BASIC, "CSeq: 1 INVITE"), "request line"),
        (msg("IN VITE sip:a@b SIP/2.0", *BASIC, "CSeq: 1 INVITE"), "request line"),
        (msg("INVITE <sip:a@b> SIP/2.0", *BASIC, "CSeq: 1 INVITE"), "Request-URI"),
        (msg("INVITE sip:a@b SIP/2.0", *BASIC, "CSeq: 1 OPTIONS"), "CSeq method"),
        (msg("INVITE sip:a@b SIP/2.0", *BASIC, "CSeq: 1 INVITE", "Content-Length: 10"), "shorter"),
        (msg("INVITE sip:a@b SIP/2.0", *BASIC, "CSeq: -1 INVITE"), "CSeq"),
        (msg("INVITE sip:a@b SIP/2.0", *BASIC), "missing CSeq"),
        (msg("INVITE sip:a@b SIP/2.0", *BASIC, "CSeq: 1 INVITE", "Max-Forwards: x"), "Max"),
        (msg("INVITE sip:a@b SIP/2.0", *BASIC, "CSeq: 1 INVITE", "Bad Header: x"), "header line"),
        (msg("INVITE sip:a@b SIP/2.0", *BASIC, "CSeq: 1 INVITE", "Expires: soon"), "Expires"),
        (
            msg("INVITE sip:a@b SIP/2.0", *BASIC, "CSeq: 1 INVITE", "l: 1", "l: 2", body="ab"),
            "conflicting",
        ),
        (msg("SIP/2.0 1000 Big", *BASIC, "CSeq: 1 INVITE"), "status"),
        (msg("SIP/2.0 099 Small", *BASIC, "CSeq: 1 INVITE"), "status"),
        (msg("INVITE sip:a@b SIP/2.0", "Via: SIP/2.0/UDP", *BASIC[1:], "CSeq: 1 INVITE"), "Via"),
    ],
)
def test_torture_rejects(raw: bytes, where: str) -> None:
    with pytest.raises(SipParseError) as info:
        parse_message(raw)
    assert info.value.position >= 0 and info.value.reason


def test_partial_message_kept_for_400() -> None:
    raw = msg("OPTIONS sip:a@b SIP/2.0", *BASIC, "CSeq: x OPTIONS")
    with pytest.raises(SipParseError) as info:
        parse_message(raw)
    partial = info.value.message
    assert isinstance(partial, Request)
    assert partial.top_via.branch == "z9hG4bK-1"


def test_udp_extra_bytes_dropped_and_missing_length_allowed() -> None:
    raw = msg(
        "OPTIONS sip:a@b SIP/2.0", *BASIC, "CSeq: 1 OPTIONS", "Content-Length: 2", body="hiXX"
    )
    assert parse_message(raw).body == b"hi"
    raw2 = msg("OPTIONS sip:a@b SIP/2.0", *BASIC, "CSeq: 1 OPTIONS", body="whole")
    assert parse_message(raw2).body == b"whole"
    lf_only = raw.replace(b"\r\n", b"\n")
    assert parse_message(lf_only).body == b"hi"


def test_headers_container() -> None:
    h = Headers()
    h.add("v", "SIP/2.0/UDP a;branch=z9hG4bK1")
    h.add("Via", "SIP/2.0/UDP b;branch=z9hG4bK2, SIP/2.0/UDP c;branch=z9hG4bK3")
    h.add("call-id", "x")
    assert [n for n, _ in h] == ["Via", "Via", "Call-ID"]
    assert len(h.get_all("VIA")) == 3
    assert h.get("i") == "x"
    h.prepend("Via", "SIP/2.0/UDP top;branch=z9hG4bK0")
    assert Via.parse(h.get("Via") or "").host == "top"
    assert h.remove_first("Via") == "SIP/2.0/UDP top;branch=z9hG4bK0"
    h.set("Via", "SIP/2.0/UDP only;branch=z9hG4bK9")
    assert h.get_all("Via") == ["SIP/2.0/UDP only;branch=z9hG4bK9"]
    h.add("WWW-Authenticate", 'Digest realm="a", nonce="b"')
    assert h.get_all("www-authenticate") == ['Digest realm="a", nonce="b"']
    h.remove("via")
    assert "Via" not in h and "Call-ID" in h
    with pytest.raises(ValueError):
        h.add("X", "a\r\nInjected: 1")
    with pytest.raises(ValueError):
        h.add("Bad Name", "a")


# ---------------------------------------------------------------- framing


def _invite(n: int, body: bytes = b"v=0\r\n") -> bytes:
    return msg(
        "INVITE sip:bob@example.org SIP/2.0",
        f"Via: SIP/2.0/TCP h;branch=z9hG4bK{n}",
        *BASIC[1:],
        f"CSeq: {n} INVITE",
        f"Content-Length: {len(body)}",
        body=body.decode(),
    )


def test_framer_whole_bytewise_and_trailing() -> None:
    stream = _invite(1) + b"\r\n\r\n" + _invite(2, b"") + _invite(3, b"x" * 10)
    whole = StreamFramer()
    whole.feed(stream + b"INVITE sip:partial")
    got = list(whole)
    assert [m.cseq.seq for m in got] == [1, 2, 3]
    assert whole.buffered == len(b"INVITE sip:partial")
    bytewise = StreamFramer()
    seen: list[int] = []
    for i in range(len(stream)):
        bytewise.feed(stream[i : i + 1])
        seen.extend(m.cseq.seq for m in bytewise)
    assert seen == [1, 2, 3]
    assert bytewise.buffered == 0


def test_framer_errors() -> None:
    no_length = msg("OPTIONS sip:a@b SIP/2.0", *BASIC, "CSeq: 1 OPTIONS")
    f = StreamFramer()
    f.feed(no_length)
    with pytest.raises(SipParseError):
        f.next_message()
    assert f.broken
    bad_then_good = StreamFramer()
    bad = msg("OPTIONS sip:a@b SIP/2.0", *BASIC, "CSeq: x OPTIONS", "Content-Length: 0")
    bad_then_good.feed(bad + _invite(7))
    with pytest.raises(SipParseError):
        bad_then_good.next_message()
    nxt = bad_then_good.next_message()
    assert nxt is not None and nxt.cseq.seq == 7
    huge = StreamFramer(max_header=100)
    huge.feed(b"A" * 200)
    with pytest.raises(SipParseError):
        huge.next_message()


# ---------------------------------------------------------------- properties

token = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~",
    min_size=1,
    max_size=12,
)
hostname = st.from_regex(r"\A[a-z][a-z0-9]{0,8}(\.[a-z][a-z0-9]{0,8}){0,2}\Z")
value_text = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters=',"<>\\'),
    max_size=30,
).map(str.strip)


@st.composite
def sip_uris(draw: st.DrawFn) -> SipUri:
    user = draw(st.none() | st.text(min_size=1, max_size=10).filter(lambda s: "\x00" not in s))
    params = draw(st.dictionaries(token.map(str.lower), st.none() | token, max_size=3))
    return SipUri(
        host=draw(hostname),
        user=user,
        port=draw(st.none() | st.integers(1, 65535)),
        scheme=draw(st.sampled_from(["sip", "sips"])),
        params=params,
    )


@given(sip_uris())
def test_uri_round_trip(uri: SipUri) -> None:
    assert SipUri.parse(str(uri)) == uri


@st.composite
def messages(draw: st.DrawFn) -> Request | Response:
    headers = Headers()
    headers.add("Via", f"SIP/2.0/UDP {draw(hostname)};branch=z9hG4bK{draw(token)}")
    headers.add("From", f"<{draw(sip_uris())}>;tag={draw(token)}")
    headers.add("To", f"{draw(st.none() | token) or ''} <{draw(sip_uris())}>".strip())
    headers.add("Call-ID", draw(token))
    method = draw(st.sampled_from(["INVITE", "ACK", "BYE", "REGISTER", "OPTIONS", "X-CUSTOM"]))
    headers.add("CSeq", f"{draw(st.integers(0, 2**31 - 1))} {method}")
    for _ in range(draw(st.integers(0, 4))):
        headers.add("X-" + draw(token), draw(value_text))
    body = draw(st.binary(max_size=64))
    headers.add("Content-Length", str(len(body)))
    if draw(st.booleans()):
        return Request(method=method, uri=str(draw(sip_uris())), headers=headers, body=body)
    reason = draw(value_text)
    return Response(status=draw(st.integers(100, 699)), reason=reason, headers=headers, body=body)


@given(messages())
@settings(max_examples=200)
def test_parse_serialize_round_trip(m: Request | Response) -> None:
    assert parse_message(serialize(m)) == m


@given(st.binary(max_size=400))
@settings(max_examples=300)
def test_random_bytes_parse_or_typed_error(data: bytes) -> None:
    with contextlib.suppress(SipParseError):
        parse_message(data)


@given(st.data())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_messages_parse_or_typed_error(data: st.DataObject) -> None:
    base = bytearray(
        data.draw(st.sampled_from([REGISTER, _invite(1), serialize(parse_message(REGISTER))]))
    )
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "dup"]))
        pos = data.draw(st.integers(0, len(base)))
        if op == "flip" and pos < len(base):
            base[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            base[pos:pos] = data.draw(
                st.sampled_from([b";", b",", b"\r\n", b" ", b'"', b"<", b"%", b"\\", b":", b"\x00"])
            )
        elif op == "delete":
            del base[pos : pos + data.draw(st.integers(1, 8))]
        else:
            base[pos:pos] = base[pos : pos + 20]
    try:
        m = parse_message(bytes(base))
    except SipParseError:
        return
    # Whatever parsed must also survive our structured views or raise the typed error.
    for view in ("cseq", "top_via", "from_", "to"):
        with contextlib.suppress(SipParseError):
            getattr(m, view)
    for name in ("Contact", "Route", "Record-Route"):
        with contextlib.suppress(SipParseError):
            for v in m.headers.get_all(name):
                NameAddr.parse(v)
    framer = StreamFramer()
    framer.feed(bytes(base))
    with contextlib.suppress(SipParseError):
        list(framer)


QUOTED = re.compile(r'"(?:[^"\\]|\\[^\r\n])*(?:"|$)')
PAIR = re.compile(r"\\[^\r\n]")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=0x2FF), max_size=12))
def test_token_and_control_checks_are_their_character_definitions(text: str) -> None:
    """The parser checks names and values with compiled patterns; they are the grammar's
    character sets exactly (RFC 3261 §25.1 token; a control character but HTAB)."""
    assert is_token(text) == (bool(text) and all(c in TOKEN_CHARS for c in text))
    line = f"Subject: {text}\r\n"
    message = (
        "OPTIONS sip:b@example.org SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\n"
        "From: <sip:a@example.org>;tag=1\r\nTo: <sip:b@example.org>\r\nCall-ID: c\r\n"
        f"CSeq: 1 OPTIONS\r\n{line}Content-Length: 0\r\n\r\n"
    )
    # Quoted-pairs inside quoted-strings may escape any character but CR and LF (§25.1).
    unescaped = QUOTED.sub(lambda m: PAIR.sub("", m.group()), text.strip(" \t"))
    control = any(ord(c) < 32 and c != "\t" for c in unescaped)
    try:
        parse_message(message.encode("utf-8", errors="surrogateescape"))
    except SipParseError as exc:
        assert control or "\r" in text or "\n" in text, exc
    else:
        assert not control


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=" \t>\\ab;=", max_size=16))
def test_split_list_without_a_scan_is_what_the_scan_gives(value: str) -> None:
    """A value with one element and nothing quoted or bracketed skips the scan; a comma
    at its end (an empty element, dropped) makes the scan run on the same value."""

    def outcome(text: str) -> list[str] | str:
        try:
            return split_list(text)
        except SipParseError as exc:
            return exc.reason

    assert outcome(value) == outcome(value + ",")


def test_a_user_part_may_hold_question_marks_and_semicolons() -> None:
    """RFC 4475 §3.1.1.2: '?' and ';' are user-unreserved; the '@' ends the userinfo."""
    uri = parse_uri("sip:a?b;c:p;w@example.com;lr?h=v")
    assert isinstance(uri, SipUri)
    assert (uri.user, uri.password, uri.host) == ("a?b;c", "p;w", "example.com")
    assert uri.params == {"lr": None} and uri.headers == {"h": "v"}
    assert parse_uri(str(uri)) == uri
    plain = parse_uri("sip:example.com;x=1?h=v")
    assert isinstance(plain, SipUri) and plain.user is None and plain.headers == {"h": "v"}


def test_control_characters_only_as_quoted_pairs() -> None:
    """§25.1: a quoted-pair may escape any character but CR and LF; elsewhere none."""
    base = REGISTER.decode()
    display = base.replace("To: Bob <", 'To: "a\\\x00b\\\x07" <', 1).encode()
    msg = parse_message(display)
    assert msg.to.display_name == "a\x00b\x07"
    for bad in ('To: "a\x00" <', "To: a\\\x00 <", 'To: "a\\'):
        with pytest.raises(SipParseError, match=r"control character|quoted"):
            parse_message(base.replace("To: Bob <", bad, 1).encode())
