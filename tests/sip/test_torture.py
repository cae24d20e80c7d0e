"""A torture suite in the spirit of RFC 4475, against a running UA on loopback.

Messages written here from the RFC's descriptions (none copied): valid-but-odd ones must
get the right answer; invalid ones a 400 or a silent drop, and never an exception in the
UA (the loop's exception handler records any). After each case a sentinel OPTIONS shows
the UA still serves; datagrams arrive in order on loopback, so a case with no answer
before the sentinel's was dropped.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from sip.aio.ua import IncomingRequest, Reply, UaConfig, UserAgent
from sip.errors import SipParseError
from sip.message import Response, parse_message
from sip.transaction import TimerConfig

DROP = 0  # the expected "status" of a case the UA must drop silently


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    expect: frozenset[int]  # acceptable statuses; {DROP} = no answer


def case(name: str, text: str, *expect: int) -> Case:
    return Case(name, text, frozenset(expect))


def req(
    start: str = "OPTIONS sip:ua@127.0.0.1 SIP/2.0",
    *,
    call_id: str,
    via: str = "Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-{cid};rport",
    headers: tuple[str, ...] = (),
    cseq: str = "CSeq: 1 OPTIONS",
    body: str = "",
    length: str | None = None,
) -> str:
    lines = [
        start,
        via,
        "Max-Forwards: 70",
        "From: <sip:t@example.org>;tag=f1",
        "To: <sip:ua@example.org>",
        f"Call-ID: {call_id}",
        cseq,
        *headers,
        f"Content-Length: {len(body.encode()) if length is None else length}",
    ]
    return "\r\n".join(lines) + "\r\n\r\n" + body


CASES = [
    # ---------------------------------------------------------------- valid, odd
    case(
        "compact forms and odd whitespace",
        "OPTIONS   sip:ua@127.0.0.1 SIP/2.0\r\n".replace("   ", " ")
        + "v:  SIP / 2.0 / UDP 127.0.0.1:{port} ;branch=z9hG4bK-{cid};rport\r\n"
        + 'f: "T"<sip:t@example.org>;tag=f1\r\nt:sip:ua@example.org\r\ni: {cid}\r\n'
        + "CSeq:   1    OPTIONS\r\nl: 0\r\nMax-Forwards: 70\r\n\r\n",
        200,
    ),
    case(
        "folded header lines",
        req(
            call_id="{cid}",
            headers=("Subject: a folded\r\n  subject\r\n\tline", "X-Odd:\r\n value"),
        ),
        200,
    ),
    case(
        "header names in odd case",
        req(call_id="{cid}").replace("Max-Forwards", "mAX-fORWARDS").replace("From:", "FROM:"),
        200,
    ),
    case(
        "escaped characters in the Request-URI user part",
        req("OPTIONS sip:sips%3Aua%40example.com@127.0.0.1;lr SIP/2.0", call_id="{cid}"),
        200,
    ),
    case(
        "escaped NUL in the user part",
        req("OPTIONS sip:ua%00null@127.0.0.1 SIP/2.0", call_id="{cid}"),
        200,
    ),
    case(
        "semicolon in the user part",
        req("OPTIONS sip:user;par=u%40example.net@127.0.0.1 SIP/2.0", call_id="{cid}"),
        200,
    ),
    case(
        "unusual but legal method token",
        req(
            "!interesting-Method0123456789_*+`.%indeed'~ sip:ua@127.0.0.1 SIP/2.0",
            call_id="{cid}",
            cseq="CSeq: 1 !interesting-Method0123456789_*+`.%indeed'~",
        ),
        501,
    ),
    case(
        "known method the UA does not serve",
        req("MESSAGE sip:ua@127.0.0.1 SIP/2.0", call_id="{cid}", cseq="CSeq: 1 MESSAGE"),
        405,
    ),
    case(
        "a very long header value and token",
        req(call_id="{cid}", headers=("X-Long: " + "a" * 3000, "X-" + "t" * 500 + ": v")),
        200,
    ),
    case(
        "many Via headers",
        req(
            call_id="{cid}",
            headers=tuple(f"Via: SIP/2.0/UDP 192.0.2.{i};branch=z9hG4bK-h{i}" for i in range(40)),
        ),
        200,
    ),
    case(
        "multipart body",
        req(
            call_id="{cid}",
            headers=('Content-Type: multipart/mixed;boundary="b1"',),
            body="--b1\r\nContent-Type: text/plain\r\n\r\nhi\r\n--b1--\r\n",
        ),
        200,
    ),
    case(
        "unknown authorization scheme",
        req(call_id="{cid}", headers=("Authorization: NoOneKnowsThisScheme opaque-data=here",)),
        200,
    ),
    case(
        "Max-Forwards zero to a UAS",
        req(call_id="{cid}").replace("Max-Forwards: 70", "Max-Forwards: 0"),
        200,
    ),
    case(
        "extra bytes after Content-Length are discarded",
        req(call_id="{cid}") + "trailing junk that is not a message",
        200,
    ),
    case(
        "Require of an unknown extension",
        req(call_id="{cid}", headers=("Require: nobody-has-this",)),
        420,
    ),
    case("tel: Request-URI", req("OPTIONS tel:+15555550100 SIP/2.0", call_id="{cid}"), 416),
    case("sips: over UDP", req("OPTIONS sips:ua@127.0.0.1 SIP/2.0", call_id="{cid}"), 416),
    case(
        "BYE for no dialog",
        req("BYE sip:ua@127.0.0.1 SIP/2.0", call_id="{cid}", cseq="CSeq: 1 BYE").replace(
            "To: <sip:ua@example.org>", "To: <sip:ua@example.org>;tag=nope"
        ),
        481,
    ),
    case(
        "CANCEL matching nothing",
        req("CANCEL sip:ua@127.0.0.1 SIP/2.0", call_id="{cid}", cseq="CSeq: 1 CANCEL"),
        481,
    ),
    # ---------------------------------------------------------------- invalid
    case("Content-Length larger than the body", req(call_id="{cid}", length="5000"), 400),
    case("negative Content-Length", req(call_id="{cid}", length="-999"), 400),
    case(
        "conflicting Content-Length headers",
        req(call_id="{cid}", headers=("Content-Length: 4",)),
        400,
    ),
    case("CSeq method mismatch", req(call_id="{cid}", cseq="CSeq: 1 INVITE"), 400),
    case("CSeq number too large", req(call_id="{cid}", cseq="CSeq: 99999999999 OPTIONS"), 400),
    case("CSeq of 5000 digits", req(call_id="{cid}", cseq=f"CSeq: {'9' * 5000} OPTIONS"), 400),
    case(
        "Via port of 5000 digits",
        req(call_id="{cid}", via="Via: SIP/2.0/UDP 127.0.0.1:" + "9" * 5000 + ";branch=z9hG4bK-x"),
        DROP,
    ),
    case(
        "rport of 5000 digits",
        req(
            call_id="{cid}",
            via="Via: SIP/2.0/UDP 127.0.0.1:{port};branch=z9hG4bK-{cid};rport=" + "9" * 5000,
        ),
        DROP,
    ),
    case(
        "unterminated quoted display name",
        req(call_id="{cid}").replace("From: <sip:t", 'From: "unterminated <sip:t'),
        400,
    ),
    case(
        "Request-URI in angle brackets",
        req("OPTIONS <sip:ua@127.0.0.1> SIP/2.0", call_id="{cid}"),
        400,
    ),
    case(
        "spaces inside the Request-URI",
        req("OPTIONS sip:ua @127.0.0.1 SIP/2.0", call_id="{cid}"),
        400,
    ),
    case(
        "two spaces between elements",
        req("OPTIONS  sip:ua@127.0.0.1 SIP/2.0", call_id="{cid}"),
        400,
    ),
    case(
        "trailing space after the version",
        req("OPTIONS sip:ua@127.0.0.1 SIP/2.0 ", call_id="{cid}"),
        400,
    ),
    case("unknown protocol version", req("OPTIONS sip:ua@127.0.0.1 SIP/7.0", call_id="{cid}"), 505),
    case(
        "missing Call-ID",
        req(call_id="{cid}").replace("Call-ID: {cid}\r\n", ""),
        DROP,  # the case is recognised by its Call-ID: with none, a 400 would not count
    ),
    case(
        "two From headers",
        req(call_id="{cid}", headers=("From: <sip:other@example.org>;tag=x",)),
        400,
    ),
    case(
        "NUL byte in a header value",
        req(call_id="{cid}", headers=("Subject: a\x00b",)),
        400,
    ),
    case("unreadable Via", req(call_id="{cid}", via="Via: garbage"), DROP),
    case("binary junk", "\x00\x01\x02\xff\xfe SIP/2.0\r\n\r\n", DROP),
    case("a lone response", "SIP/2.0 200 OK\r\nCall-ID: {cid}\r\n\r\n", DROP),
    case(
        "thousands of header fields",
        req(call_id="{cid}", headers=tuple(f"X{i}: a" for i in range(3000))),
        400,
    ),
]


@dataclass
class Target:
    ua: UserAgent
    sock: socket.socket
    port: int
    errors: list[dict[str, object]]


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

    async def handler(_req: IncomingRequest) -> Reply:
        return Reply(200)

    ua = UserAgent(UaConfig(aor="sip:ua@example.org", timers=TimerConfig(t1=0.05)), handler)
    await ua.start("127.0.0.1")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        yield Target(ua, sock, sock.getsockname()[1], errors)
    finally:
        sock.close()
        await ua.close()
        loop.set_exception_handler(previous)


async def answers_until_sentinel(t: Target, sentinel: str) -> list[Response]:
    """Responses received before the sentinel's (its Call-ID ends the wait)."""
    loop = asyncio.get_running_loop()
    got: list[Response] = []
    while True:
        data = await asyncio.wait_for(loop.sock_recv(t.sock, 70000), 5)
        try:
            msg: object = parse_message(data)
        except SipParseError as exc:
            # A 400 copies the request's own bad CSeq or From (§8.2.6.2): read what we can.
            msg = exc.message
        assert isinstance(msg, Response)
        if msg.call_id == sentinel:
            assert msg.status == 200
            return got
        if msg.status > 100:
            got.append(msg)


@pytest.mark.parametrize("c", CASES, ids=[c.name for c in CASES])
async def test_torture(target: Target, c: Case) -> None:
    loop = asyncio.get_running_loop()
    cid = "torture-" + c.name.replace(" ", "-")[:40]
    wire = c.text.replace("{cid}", cid).replace("{port}", str(target.port))
    await loop.sock_sendto(
        target.sock, wire.encode("utf-8", "surrogateescape"), target.ua.local_addr
    )
    sentinel = f"sentinel-{cid}"
    probe = req(call_id=sentinel).replace("{cid}", sentinel).replace("{port}", str(target.port))
    await loop.sock_sendto(target.sock, probe.encode(), target.ua.local_addr)
    got = [r for r in await answers_until_sentinel(target, sentinel) if r.call_id == cid]
    statuses = {r.status for r in got} or {DROP}
    assert statuses <= c.expect, (c.name, statuses)
    assert len(got) <= 1
    for r in got:
        # Every final answer carries a To tag (§8.2.6.2).
        assert ";tag=" in (r.headers.get("To") or "")
    assert target.errors == []
