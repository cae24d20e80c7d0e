"""Path validation: a peer's address changes only after the new path answered a
PATH_CHALLENGE; a copy of a valid datagram from elsewhere does not move it. On the
connection alone with a hand-stepped clock, then through the asyncio adapter."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rudp import MessageReceived, RudpConfig, RudpConnection
from rudp import packet as wire
from rudp.aio import RudpEndpoint
from rudp.connection import Event, PathChallenged, PathValidated
from rudp.path import CHALLENGE_INTERVAL, Address

KEY = bytes(range(32))
FAST = RudpConfig(rto_initial=0.1, rto_min=0.05, keepalive_interval=0)
GUARD = 10.0

A: Address = ("192.0.2.1", 4000)  # the peer's address
A2: Address = ("198.51.100.7", 4001)  # where the peer moves to
SPOOF: Address = ("203.0.113.9", 666)  # a forged source
B: Address = ("192.0.2.2", 5000)


def _connections() -> tuple[RudpConnection, RudpConnection]:
    a = RudpConnection(KEY, FAST, sender_id=1, peer_address=B)
    b = RudpConnection(KEY, FAST, sender_id=2, peer_address=A)
    return a, b


def _events(conn: RudpConnection) -> list[Event]:
    events = []
    while (event := conn.next_event()) is not None:
        events.append(event)
    return events


def _token(challenge: bytes) -> bytes:
    """The token of a PATH_CHALLENGE datagram sent by sender 2 (the side that validates)."""
    header = wire.pull_header(challenge)
    payload = wire.SenderKeys(KEY, 2, wire.Protection.AEAD).open(challenge, header.pn)
    assert payload is not None
    (frame,) = wire.pull_frames(payload)
    assert isinstance(frame, wire.PathChallenge)
    return frame.token


def _message(a: RudpConnection, data: bytes, now: float) -> bytes:
    a.send_message(data, now)
    (datagram,) = a.datagrams_to_send(now)
    return datagram


def test_spoofed_source_is_challenged_and_never_accepted() -> None:
    a, b = _connections()
    assert b.receive_datagram(_message(a, b"first", 0.0), 0.0, SPOOF)  # the copy came first
    assert _events(b) == [MessageReceived(b"first"), PathChallenged(SPOOF, A)]
    challenge = b.path_challenge_to_send(0.0)
    assert challenge is not None and challenge[1] == SPOOF
    assert b.peer_address == A
    # Whoever forged the source cannot read the token: a response with another token,
    # even authentic, from the candidate address does not move the peer.
    keys = wire.SenderKeys(KEY, 1, wire.Protection.AEAD)
    forged = wire.seal(keys, wire.Header(b.cid, 1, 100), [wire.PathResponse(b"\0" * 8)])
    b.receive_datagram(forged, 0.01, SPOOF)
    # The right token, but from another address than the one challenged, does not either.
    assert a.receive_datagram(challenge[0], 0.02, B)
    (response,) = a.datagrams_to_send(0.02)
    b.receive_datagram(response, 0.03, A)
    assert b.stats.path_responses_ignored == 2
    assert b.peer_address == A and b.path_changes == 0
    assert not any(isinstance(e, PathValidated) for e in _events(b))
    b.send_message(b"reply", 0.04)
    assert b.datagrams_to_send(0.04) and b.peer_address == A  # data still goes to A


def test_real_move_is_accepted_after_validation_and_data_follows() -> None:
    a, b = _connections()
    assert b.receive_datagram(_message(a, b"before", 0.0), 0.0, A)
    _events(b)
    b.datagrams_to_send(0.0)
    b.send_message(b"lost on the old path", 0.1)
    assert b.datagrams_to_send(0.1)  # sent to A, which the peer has left
    assert b.receive_datagram(_message(a, b"after", 0.2), 0.2, A2)
    assert _events(b) == [MessageReceived(b"after"), PathChallenged(A2, A)]
    challenge = b.path_challenge_to_send(0.2)
    assert challenge is not None and challenge[1] == A2
    assert b.peer_address == A  # not before the answer
    assert a.receive_datagram(challenge[0], 0.21, B)
    (response,) = a.datagrams_to_send(0.21)
    b.receive_datagram(response, 0.22, A2)
    assert _events(b) == [PathValidated(A2, A)]
    assert b.peer_address == A2 and b.path_changes == 1
    # What was in flight over the old path is sent again at once, to the new address,
    # not at the retransmission timeout.
    resent = b.datagrams_to_send(0.22)
    assert resent and b.stats.retransmissions == 1
    for datagram in resent:
        a.receive_datagram(datagram, 0.23, B)
    assert MessageReceived(b"lost on the old path") in _events(a)
    assert b.path_challenge_to_send(0.3) is None  # the validated path is challenged no more


def test_challenges_to_one_candidate_are_rate_limited() -> None:
    a, b = _connections()
    sent: list[bytes] = []
    for i, now in enumerate((0.0, 0.01, 0.02, CHALLENGE_INTERVAL, CHALLENGE_INTERVAL + 0.01)):
        assert b.receive_datagram(_message(a, b"m%d" % i, now), now, A2)
        challenge = b.path_challenge_to_send(now)
        if challenge is not None:
            sent.append(challenge[0])
    assert len(sent) == 2 == b.stats.path_challenges_sent  # at 0 and once the interval passed
    assert _token(sent[0]) == _token(sent[1])  # the same challenge, repeated
    # Another address replaces the candidate at once, with a token of its own.
    now = CHALLENGE_INTERVAL + 0.02
    assert b.receive_datagram(_message(a, b"elsewhere", now), now, SPOOF)
    challenge = b.path_challenge_to_send(now)
    assert challenge is not None and challenge[1] == SPOOF
    assert _token(challenge[0]) != _token(sent[0])


def test_an_old_datagram_from_elsewhere_starts_no_validation() -> None:
    """Only the newest authentic datagram names a candidate: a replayed or reordered
    older one from another source (a copy resent later) does not."""
    a, b = _connections()
    first = _message(a, b"one", 0.0)
    second = _message(a, b"two", 0.0)
    assert b.receive_datagram(second, 0.0, A)
    assert not b.receive_datagram(first, 0.01, SPOOF)  # older than the newest seen
    assert b.path_challenge_to_send(0.01) is None
    assert b.stats.path_challenges_sent == 0


def test_an_address_given_by_signalling_ends_its_validation() -> None:
    a, b = _connections()
    assert b.receive_datagram(_message(a, b"x", 0.0), 0.0, A2)
    b.set_peer_address(A2, 0.0)
    assert b.peer_address == A2
    assert b.path_challenge_to_send(0.0) is None


def test_without_addresses_nothing_is_validated() -> None:
    a = RudpConnection(KEY, FAST, sender_id=1)
    b = RudpConnection(KEY, FAST, sender_id=2)
    assert b.receive_datagram(_message(a, b"x", 0.0), 0.0)
    assert b.receive_datagram(_message(a, b"y", 0.0), 0.0, A2)
    assert b.path_challenge_to_send(0.0) is None and b.peer_address is None


SOURCES = (A, A2, SPOOF)
ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.sampled_from(SOURCES)),
        st.tuples(st.just("answer"), st.tuples(st.integers(0, 7), st.sampled_from(SOURCES))),
        st.tuples(st.just("wait"), st.sampled_from((0.0, 0.01, CHALLENGE_INTERVAL))),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
def test_the_peer_moves_only_to_the_address_that_answered_its_current_challenge(
    actions: list[tuple[str, object]],
) -> None:
    """Any interleaving of datagrams from three sources, answers to any challenge sent so
    far (delivered from any of them) and waits: the peer's address changes exactly when
    an answer comes from the address its challenge went to, while that challenge is the
    candidate's current one; any other authentic newest datagram from elsewhere (an
    answer included) makes its source the candidate; each candidate is challenged at
    most once per interval."""
    a, b = _connections()
    now = 0.0
    peer, episode = A, 0  # the model: the peer's address, the candidate's number
    candidate: Address | None = None
    challenges: list[tuple[bytes, Address, int]] = []  # datagram, address, episode
    answered: set[int] = set()  # a challenge delivered again is a replay: no answer
    challenged_at: dict[int, float] = {}
    for kind, arg in actions:
        if kind == "wait":
            assert isinstance(arg, float)
            now += arg
            continue
        if kind == "data":
            assert isinstance(arg, tuple)
            source: Address = arg
            b.receive_datagram(_message(a, b"x", now), now, source)
            if source != peer and source != candidate:
                candidate, episode = source, episode + 1
        else:
            assert isinstance(arg, tuple)
            index, source = arg
            if index >= len(challenges) or index in answered:
                continue
            answered.add(index)
            datagram, address, number = challenges[index]
            a.receive_datagram(datagram, now, B)
            fresh = False
            for response in a.datagrams_to_send(now):
                fresh = b.receive_datagram(response, now, source)
            if source == address == candidate and number == episode:
                peer, candidate = source, None
            elif fresh and source != peer and source != candidate:
                candidate, episode = source, episode + 1  # the answer is a datagram too
        _events(b)
        assert b.peer_address == peer
        challenge = b.path_challenge_to_send(now)
        if challenge is not None:
            assert challenge[1] == candidate
            assert now - challenged_at.get(episode, -1.0) >= CHALLENGE_INTERVAL
            challenged_at[episode] = now
            challenges.append((challenge[0], challenge[1], episode))


class Relay(asyncio.DatagramProtocol):
    """a <-> relay <-> b on one socket; can send a copy of the next a->b datagram first
    from an attacker's socket (a spoofed source: the copy arrives before the original)."""

    def __init__(self, b: tuple[str, int]) -> None:
        self.b = b
        self.a: tuple[str, int] | None = None
        self.send: Callable[[bytes, tuple[str, int]], None] | None = None
        self.attacker: asyncio.DatagramTransport | None = None
        self.copy_next = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.send = getattr(transport, "sendto")  # noqa: B009

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        source = (str(addr[0]), int(addr[1]))
        assert self.send is not None
        if source == self.b:
            if self.a is not None:
                self.send(data, self.a)
            return
        self.a = source
        if self.copy_next and self.attacker is not None:
            self.copy_next = False
            self.attacker.sendto(data, self.b)
        self.send(data, self.b)


class Sink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.got.put_nowait(data)


async def test_adapter_does_not_follow_a_spoofed_copy(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rudp")
    loop = asyncio.get_running_loop()
    a = await RudpEndpoint.open("127.0.0.1", 0, FAST)
    b = await RudpEndpoint.open("127.0.0.1", 0, FAST)
    relay_t, relay = await loop.create_datagram_endpoint(
        lambda: Relay(b.local_addr), local_addr=("127.0.0.1", 0)
    )
    relay_addr = relay_t.get_extra_info("sockname")[:2]
    attacker_t, attacker = await loop.create_datagram_endpoint(Sink, local_addr=("127.0.0.5", 0))
    relay.attacker = attacker_t
    try:
        pa = a.peer(KEY, relay_addr)
        pb = b.peer(KEY, relay_addr)
        await asyncio.wait_for(pa.send(b"first"), GUARD)
        assert await asyncio.wait_for(pb.receive(), GUARD) == b"first"
        relay.copy_next = True
        await asyncio.wait_for(pa.send(b"second"), GUARD)
        assert await asyncio.wait_for(pb.receive(), GUARD) == b"second"
        # The copy from 127.0.0.5 authenticated and was the newest: b challenged that
        # path, which cannot answer (it does not hold the keys), and kept the peer.
        challenge = await asyncio.wait_for(attacker.got.get(), GUARD)
        assert challenge[0] == 2  # a RUDP v2 datagram, encrypted
        assert pb.addr == relay_addr and pb.path_changes == 0
        assert pb.stats.path_challenges_sent == 1
        await asyncio.wait_for(pb.send(b"reply"), GUARD)  # still reaches a, via the relay
        assert await asyncio.wait_for(pa.receive(), GUARD) == b"reply"
        assert any("validating new path" in r.getMessage() for r in caplog.records)
    finally:
        await a.close()
        await b.close()
        relay_t.close()
        attacker_t.close()


async def test_adapter_follows_a_real_move_after_the_challenge(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rudp")
    a = await RudpEndpoint.open("127.0.0.2", 0, FAST)
    b = await RudpEndpoint.open("127.0.0.1", 0, FAST)
    try:
        pa = a.peer(KEY, b.local_addr)
        pb = b.peer(KEY, a.local_addr)
        await asyncio.wait_for(pa.send(b"before"), GUARD)
        assert await asyncio.wait_for(pb.receive(), GUARD) == b"before"
        await a.rebind("127.0.0.3", 0)  # the device moved; no re-INVITE here
        await asyncio.wait_for(pa.send(b"after"), GUARD)
        assert await asyncio.wait_for(pb.receive(), GUARD) == b"after"
        await asyncio.wait_for(pb.send(b"to the new address"), GUARD)
        assert await asyncio.wait_for(pa.receive(), GUARD) == b"to the new address"
        assert pb.addr == a.local_addr and pb.path_changes == 1
        assert pa.stats.path_responses_sent >= 1
        assert any("validated" in r.getMessage() for r in caplog.records)
    finally:
        await a.close()
        await b.close()
