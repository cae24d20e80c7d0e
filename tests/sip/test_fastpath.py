"""The REGISTER fast path: it answers exactly as the full stack does, keeps
the answer for retransmissions, never takes what the full parser would refuse, and
hands everything else to the full path, which answers it."""

from __future__ import annotations

import asyncio
import itertools
import re
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sip.aio.transport import bind_sockets
from sip.aio.ua import UaConfig, UserAgent
from sip.errors import SipParseError
from sip.fastpath import TAGS_PER_DRAW, FastRegistrar, ResponseCache, scan_register
from sip.message import Request, parse_message
from sip.registrar import MemoryBindingStore, Registrar, RegistrarConfig
from sip.tools.registrar import RegistrarService
from sip.ua import check_request
from sip.uri import SipUri, Via

SOURCE = ("127.0.0.1", 5898)
NOW = 1000.0


def register(
    user: str = "alice",
    *,
    branch: str = "z9hG4bK-1",
    call_id: str = "c1@h",
    cseq: int = 1,
    contact: str | None = "<sip:{user}@127.0.0.1:5898>",
    expires: str | None = "600",
    extra: tuple[str, ...] = (),
    via: str = "SIP/2.0/UDP 127.0.0.1:5898;branch={branch};rport",
    uri: str = "sip:example.org",
    to: str = "<sip:{user}@example.org>",
) -> bytes:
    lines = [
        f"REGISTER {uri} SIP/2.0",
        "Via: " + via.format(branch=branch),
        f"From: <sip:{user}@example.org>;tag=f{cseq}",
        "To: " + to.format(user=user),
        f"Call-ID: {call_id}",
        f"CSeq: {cseq} REGISTER",
    ]
    if contact is not None:
        lines.append("Contact: " + contact.format(user=user))
    if expires is not None:
        lines.append(f"Expires: {expires}")
    lines += [*extra, "Max-Forwards: 70", "Content-Length: 0"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def fast_registrar() -> FastRegistrar:
    registrar = Registrar(
        RegistrarConfig(domains=("example.org",), default_expires=600),
        MemoryBindingStore(),
        bytes,  # a zero tag: the same To tag every time, for byte comparisons
    )
    return FastRegistrar(registrar, "mdeci-sip/0.1", cache=ResponseCache(lifetime=32.0))


def without_tag(response: bytes) -> bytes:
    return re.sub(rb"(\r\nTo: [^\r]*);tag=[0-9a-f]+", rb"\1", response)


# ------------------------------------------------------------------ sans-IO


def test_a_plain_register_is_taken_and_answered_200() -> None:
    fast = fast_registrar()
    answer = fast.handle(register(), SOURCE, NOW)
    assert answer is not None
    data, dest = answer
    assert dest == SOURCE  # rport: back to the packet's source
    assert data.startswith(b"SIP/2.0 200 OK\r\n")
    assert b"\r\nContact: <sip:alice@127.0.0.1:5898>;expires=600\r\n" in data
    assert b";rport=5898;received=127.0.0.1\r\n" in data


def test_every_answer_gets_its_own_random_to_tag() -> None:
    registrar = Registrar(
        RegistrarConfig(domains=("example.org",)), MemoryBindingStore(), secrets.token_bytes
    )
    fast = FastRegistrar(registrar, "mdeci-sip/0.1")
    tags = []
    for n in range(3 * TAGS_PER_DRAW + 1):
        answer = fast.handle(register(f"u{n}", branch=f"z9hG4bK-t{n}"), SOURCE, NOW)
        assert answer is not None
        found = re.search(rb"\r\nTo: [^\r]*;tag=([0-9a-f]+)\r\n", answer[0])
        assert found is not None and len(found.group(1)) == 16
        tags.append(found.group(1))
    assert len(set(tags)) == len(tags)


def test_a_retransmission_gets_the_identical_response_and_changes_nothing() -> None:
    fast = fast_registrar()
    first = fast.handle(register(), SOURCE, NOW)
    events = fast.registrar.next_event()
    again = fast.handle(register(), SOURCE, NOW + 31.0)
    assert again == first
    assert events is not None and fast.registrar.next_event() is None
    assert fast.retransmissions == 1
    # A new request with the same Call-ID and CSeq (another branch) is no retransmission:
    # step 7 refuses it, as the full path does.
    other = fast.handle(register(branch="z9hG4bK-2"), SOURCE, NOW + 1)
    assert other is not None and other[0].startswith(b"SIP/2.0 500 ")


def test_the_answer_is_kept_for_timer_j_only() -> None:
    fast = fast_registrar()
    fast.handle(register(), SOURCE, NOW)
    late = fast.handle(register(), SOURCE, NOW + 32.0)
    assert late is not None and late[0].startswith(b"SIP/2.0 500 ")  # processed anew


def test_the_cache_is_bounded_oldest_first() -> None:
    cache = ResponseCache(lifetime=32.0, limit=2)
    for n in range(3):
        cache.put((f"b{n}", "h:1"), b"r", SOURCE, NOW)
    assert len(cache) == 2
    assert cache.get(("b0", "h:1"), NOW) is None
    assert cache.get(("b2", "h:1"), NOW) == (b"r", SOURCE)


def test_an_aborted_batch_is_forgotten() -> None:
    fast = fast_registrar()
    fast.begin()
    fast.handle(register(), SOURCE, NOW)
    fast.abort()
    assert len(fast.cache) == 0


@pytest.mark.parametrize(
    "via",
    [
        "SIP/2.0/UDP 127.0.0.1:5898;branch=z9hG4bK-v;rport",
        "SIP/2.0/UDP 127.0.0.1:5898;rport;branch=z9hG4bK-v",
        "SIP/2.0/UDP 10.1.2.3:6000;branch=z9hG4bK-v",
        "SIP/2.0/UDP 10.1.2.3;branch=z9hG4bK-v",
        "SIP/2.0/UDP 127.0.0.1;branch=z9hG4bK-v",
        "SIP/2.0/UDP phone.example.net:5070;branch=z9hG4bK-v;rport",
    ],
)
def test_the_via_is_stamped_and_answered_as_the_transaction_layer_does(via: str) -> None:
    answer = fast_registrar().handle(register(via=via), SOURCE, NOW)
    assert answer is not None
    stamped = Via.parse(via)
    stamped.stamp(*SOURCE)  # §18.2.1 / RFC 3581, as TransactionLayer.receive does
    assert f"\r\nVia: {stamped}\r\n".encode() in answer[0]
    assert answer[1] == stamped.response_address()


@pytest.mark.parametrize(
    "data",
    [
        register(uri="sip:elsewhere.org"),  # 404 from the full path
        register(to="<sip:{user}@elsewhere.org>"),
        register(to="<sip:{user}@example.org>;tag=x"),
        register(extra=("Require: gruu",)),  # 420
        register(extra=("Authorization: Digest username=alice",)),
        register(contact="*", expires="0"),
        register(contact="<sip:a@h>, <sip:b@h>"),
        register(contact="<sip:{user}@h>;q=0.5"),
        register(via="SIP/2.0/TCP 127.0.0.1:5898;branch={branch}"),
        register(via="SIP/2.0/UDP 127.0.0.1:5898;branch=1234"),  # RFC 2543 branch
        register(via="SIP/2.0/UDP 127.0.0.1:5898;branch={branch};received=1.2.3.4"),
        register(extra=("Via: SIP/2.0/UDP 10.0.0.1;branch=z9hG4bK-x",)),
        register(expires="soon"),
        register().replace(
            b"REGISTER sip:example.org SIP/2.0", b"REGISTER sip:example.org SIP/3.0"
        ),
        register().replace(b"Content-Length: 0", b"Content-Length: 4") + b"abcd",
        register().replace(b"\r\nMax-Forwards", b"\r\n Max-Forwards"),  # folded
        register().replace(b"alice", "al\u00efce".encode()),
        b"OPTIONS sip:example.org SIP/2.0\r\n\r\n",
    ],
)
def test_other_requests_go_to_the_full_path(data: bytes) -> None:
    assert fast_registrar().handle(data, SOURCE, NOW) is None


LINES = [
    "Via: SIP/2.0/UDP 127.0.0.1:5898;branch=z9hG4bK-x;rport",
    "From: <sip:u@example.org>;tag=1",
    "To: <sip:u@example.org>",
    "Call-ID: c@h",
    "CSeq: 7 REGISTER",
    "Contact: <sip:u@127.0.0.1:5898>;expires=60",
    "Expires: 600",
    "Content-Length: 0",
]
ALPHABET = st.sampled_from([*' \t\r\n:;,<>"@=%0aZ.-/\x00\x7f', "\u00e9", "REGISTER", "tag"])


@st.composite
def mutated_registers(draw: st.DrawFn) -> bytes:
    lines = draw(st.permutations(LINES))
    lines = lines[: draw(st.integers(len(lines) - 2, len(lines)))]
    text = "\r\n".join(["REGISTER sip:example.org SIP/2.0", *lines]) + "\r\n\r\n"
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 2))
        text = text[:at] + draw(ALPHABET) + text[at + cut :]
    return text.encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(st.one_of(mutated_registers(), st.binary(max_size=300)))
def test_fuzz_never_raises_and_takes_only_what_the_full_parser_accepts(data: bytes) -> None:
    scanned = scan_register(data)
    answer = fast_registrar().handle(data, SOURCE, NOW)
    if scanned is None:
        return
    msg = parse_message(data)  # the full parser accepts it too ...
    assert isinstance(msg, Request) and msg.method == "REGISTER"
    assert check_request(msg, "udp") is None  # ... and the UA would not refuse it
    assert scanned.call_id == msg.call_id and scanned.seq == msg.cseq.seq
    to_uri = msg.to.uri
    assert isinstance(to_uri, SipUri) and scanned.aor == to_uri.aor
    if answer is not None:
        assert answer[0].startswith(b"SIP/2.0 ")


# ------------------------------------------------------------------ fast vs full, on UDP


@dataclass
class Pair:
    fast: tuple[str, int]
    full: tuple[str, int]


async def _serve(fast_path: bool) -> tuple[UserAgent, tuple[str, int]]:
    registrar = Registrar(
        RegistrarConfig(domains=("example.org", "127.0.0.1"), default_expires=600),
        MemoryBindingStore(),
        bytes,
    )
    service = RegistrarService(registrar, quiet=True, clock=lambda: NOW)
    config = UaConfig(aor="sip:registrar@example.org", methods=frozenset({"REGISTER"}))
    ua = UserAgent(config, service, random=bytes)
    service.ua = ua
    if fast_path:
        service.fast = FastRegistrar(registrar, config.user_agent)
        ua.transports.on_datagrams = service.on_datagrams
    udp, tcp = bind_sockets("127.0.0.1", 0)
    return ua, await ua.start_on(udp, tcp)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    fast_ua, fast_addr = await _serve(True)
    full_ua, full_addr = await _serve(False)
    try:
        yield Pair(fast_addr, full_addr)
    finally:
        await fast_ua.close()
        await full_ua.close()


async def exchange(data: bytes, dest: tuple[str, int], sock: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    await loop.sock_sendto(sock, data, dest)
    reply, _ = await asyncio.wait_for(loop.sock_recvfrom(sock, 65535), 5)
    return reply


async def fast_and_full(pair: Pair, data: bytes) -> tuple[bytes, bytes]:
    """The answers of the fast-path registrar and of the full-path one to ``data``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        return await exchange(data, pair.fast, sock), await exchange(data, pair.full, sock)
    finally:
        sock.close()


CASES = [
    register(),
    register(expires=None),  # the default expiry
    register(contact="<sip:{user}@127.0.0.1:5898;transport=udp>;expires=3600", expires=None),
    register(contact='"Alice" <sip:{user}@10.0.0.9:5070>;expires=0'),  # removal
    register(contact=None),  # a query
    register(expires="5"),  # 423 + Min-Expires
    register(expires="99999999"),  # shortened to max_expires
    register(via="SIP/2.0/UDP 127.0.0.1;rport;branch={branch}"),
    register(uri="sip:127.0.0.1", extra=("User-Agent: phone/1.0", "k: path")),
    register(extra=("X-Odd: a,b;c",)),
]


async def test_fast_and_full_paths_answer_alike(pair: Pair) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        for n, case in enumerate(CASES):
            data = case.replace(b"z9hG4bK-1", f"z9hG4bK-case{n}".encode())
            fast = await exchange(data, pair.fast, sock)
            full = await exchange(data, pair.full, sock)
            assert scan_register(data) is not None, data
            assert without_tag(fast) == without_tag(full), (data, fast, full)
    finally:
        sock.close()


async def test_refusals_and_declined_requests_get_the_full_paths_answer(pair: Pair) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        cases = {
            register(uri="sip:elsewhere.org", branch="z9hG4bK-d1"): 404,
            register(extra=("Require: gruu",), branch="z9hG4bK-d2"): 420,
            register(contact="*", expires="5", branch="z9hG4bK-d3"): 400,
            register(branch="z9hG4bK-d4").replace(b"CSeq: 1 REGISTER", b"CSeq: 1 INVITE"): 400,
            register(contact="<sip:{user}@h>;q=2", branch="z9hG4bK-d5"): 400,
        }
        for data, status in cases.items():
            fast = await exchange(data, pair.fast, sock)
            assert fast.startswith(f"SIP/2.0 {status} ".encode()), fast
            full = await exchange(data, pair.full, sock)
            assert without_tag(fast) == without_tag(full)
    finally:
        sock.close()


BRANCHES = itertools.count()


async def test_a_retransmission_over_udp_gets_the_same_bytes(pair: Pair) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    try:
        data = register("rex", branch="z9hG4bK-rex")
        first = await exchange(data, pair.fast, sock)
        again = await exchange(data, pair.fast, sock)
        assert first == again and first.startswith(b"SIP/2.0 200 OK")
    finally:
        sock.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    user=st.from_regex(r"[a-z0-9][a-z0-9._-]{0,12}", fullmatch=True),
    contact_host=st.sampled_from(["127.0.0.1", "10.0.0.7", "phone.example.net"]),
    port=st.one_of(st.none(), st.integers(1, 65535)),
    expires=st.one_of(st.none(), st.integers(0, 5000).map(str)),
    param=st.one_of(st.none(), st.integers(0, 5000)),
    display=st.sampled_from(["", '"A b" ', "Bob "]),
    cseq=st.integers(1, 2**31 - 1),
)
async def test_fast_equals_full_on_generated_registers(
    pair: Pair,
    user: str,
    contact_host: str,
    port: int | None,
    expires: str | None,
    param: int | None,
    display: str,
    cseq: int,
) -> None:
    hostport = contact_host if port is None else f"{contact_host}:{port}"
    contact = f"{display}<sip:{user}@{hostport}>" + ("" if param is None else f";expires={param}")
    data = register(
        user, contact=contact, expires=expires, cseq=cseq, branch=f"z9hG4bK-g{next(BRANCHES)}"
    )
    try:
        parse_message(data)
    except SipParseError:
        return
    assert scan_register(data) is not None  # the fast path takes it (else: full vs full)
    fast, full = await fast_and_full(pair, data)
    assert without_tag(fast) == without_tag(full)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=mutated_registers())
async def test_fast_equals_full_on_mutated_registers(pair: Pair, data: bytes) -> None:
    """Whatever the fast path takes of a mangled REGISTER, it answers as the full path."""
    branch = f"z9hG4bK-m{next(BRANCHES)}".encode()
    data = data.replace(b"z9hG4bK-x", branch)
    if branch not in data or scan_register(data) is None:
        return  # the full path alone answers it (or a retransmission would be compared)
    fast, full = await fast_and_full(pair, data)
    assert without_tag(fast) == without_tag(full), (data, fast, full)
