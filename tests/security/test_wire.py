"""What the wire shows, and an on-path attacker on the SDP.

Real agents (``mdeci.agent.Agent``) against the real broker (``run_broker``) on
loopback; every datagram is captured from ``lo`` by a packet socket, as an observer
on the path would see it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import re
import secrets
from pathlib import Path

import pytest

from mdeci.agent import Agent, Status
from mdeci.broker.app import RunningBroker
from mdeci.config import AgentConfig, AuthConfig, BrokerMediaConfig, HostPort
from mdeci.store.repo import BrokerStore
from rudp.keys import KeyExchange
from sip.auth import compute_ha1
from sip.sdp import encode_key
from tests.agent.farend import GUARD, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink
from tests.loopback_broker import broker_config, run_loopback_broker, users
from tests.security.capture import LoopbackCapture

USERS = ("alice", "bob")
ALICE = "sip:alice@localhost"


async def start_broker(
    tmp: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    *,
    key_confirm_timeout: float = 10.0,
    transport: str = "rudp",
) -> RunningBroker:
    """The loopback broker, accepting the data channel ``transport`` only."""
    auth = AuthConfig(users=users(*USERS), key_confirm_timeout=key_confirm_timeout)
    media = BrokerMediaConfig(transports=(transport,))
    return await run_loopback_broker(broker_config(tmp, auth=auth, media=media), store, clock, sink)


def _on(config: AgentConfig, transport: str) -> AgentConfig:
    return dataclasses.replace(config, media=dataclasses.replace(config.media, transport=transport))


def _media_ports(broker: RunningBroker) -> set[int]:
    """The broker's data-channel ports: RUDP's, and QUIC's server when it has one."""
    quic = broker.service.quic
    return {broker.media_addr[1]} | (set() if quic is None else {quic.local_addr[1]})


def _forms(secret: bytes) -> list[bytes]:
    """The ways a secret could show up in a datagram: raw, hex, base64 (both alphabets)."""
    return [
        secret,
        secret.hex().encode(),
        secret.hex().upper().encode(),
        base64.b64encode(secret).rstrip(b"="),
        base64.urlsafe_b64encode(secret).rstrip(b"="),
    ]


@pytest.mark.parametrize("transport", ["rudp", "quic"])
async def test_no_payload_and_no_key_material_on_the_wire(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink, transport: str
) -> None:
    broker = await start_broker(tmp_path, store, clock, sink, transport=transport)
    media_ports = _media_ports(broker)
    capture = LoopbackCapture(ports={broker.sip_addr[1], *media_ports}).open()
    marker = b"MARKER-" + secrets.token_hex(12).encode()
    alice_cfg = _on(
        agent_config(tmp_path / "alice", "alice", "127.0.0.2", broker.sip_addr[1]), transport
    )
    alice = Agent(alice_cfg, address_source=lo_only)
    bob = Agent(
        _on(agent_config(tmp_path / "bob", "bob", "127.0.0.4", broker.sip_addr[1]), transport),
        address_source=lo_only,
    )
    secrets_seen: set[bytes] = set()

    def note_secrets() -> None:
        for user in USERS:
            record = store.sessions.get_session(f"sip:{user}@localhost")
            if record is not None and record.session_key:
                secrets_seen.add(record.session_key)

    try:
        await alice.start()
        await bob.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        await asyncio.wait_for(bob.wait_connected(), GUARD)
        assert alice.status().media_transport == transport
        note_secrets()
        await asyncio.wait_for(alice.subscribe("wire.*"), GUARD)
        inbox = alice.listen()
        for i in range(100):
            payload = marker + b"-" + str(i).encode()
            result = await asyncio.wait_for(
                bob.publish("wire.test", {"marker": marker.decode()}, payload), GUARD
            )
            assert result.state == "published"
            if i == 49:
                # A move half-way: new SIP contact, new media address (QUIC: the
                # connection migrates), same keys.
                await asyncio.wait_for(alice.move_to("127.0.0.3"), GUARD)
        got = [await asyncio.wait_for(inbox.get(), GUARD) for _ in range(100)]
        assert [g["nseq"] for g in got] == list(range(1, 101))
        # A reconnect: the agent restarts (BYE, then a new INVITE with fresh keys).
        await alice.close()
        alice = Agent(dataclasses.replace(alice_cfg), address_source=lo_only)
        await alice.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        note_secrets()
        await asyncio.wait_for(bob.publish("wire.test", {"marker": "last"}, marker), GUARD)
        await asyncio.wait_for(alice.wait_until(lambda: alice.delivered_since(101) != []), GUARD)
        assert [n["nseq"] for n in alice.delivered_since(101)] == [101]
    finally:
        await alice.close()
        await bob.close()
        await broker.close()
        capture.close()

    datagrams = capture.datagrams
    media = [d for d in datagrams if media_ports & {d.src[1], d.dst[1]}]
    sip = [d for d in datagrams if broker.sip_addr[1] in (d.src[1], d.dst[1])]
    # The capture saw the traffic: every notification, the SIP of the move and reconnect.
    assert len(media) > 200
    assert sum(b"INVITE sip:broker@localhost" in d.payload for d in sip) >= 2
    assert len(secrets_seen) >= 3  # alice, bob, alice again: fresh keys per session
    hidden = [marker, *(form for s in secrets_seen for form in _forms(s))]
    for user in USERS:
        for algorithm in ("SHA-256", "MD5"):
            hidden += _forms(
                bytes.fromhex(compute_ha1(user, "localhost", f"{user}-secret", algorithm))
            )
        hidden.append(f"{user}-secret".encode())
    leaks = [(d.src, d.dst) for d in datagrams for h in hidden if h in d.payload]
    assert leaks == []
    # The SDP carries the public values (and nothing that names a key in clear).
    assert not any(b"mdeci-key" in d.payload for d in sip)
    assert sum(b"a=mdeci-kx:" in d.payload for d in sip) >= 4  # offers and answers


# ---------------------------------------------------------------------------- attacker

_KX = re.compile(rb"a=mdeci-kx:([A-Za-z0-9_-]{43})")


class SdpRewriter(asyncio.DatagramProtocol):
    """An on-path SIP relay that swaps every ``a=mdeci-kx`` public value for its own.

    It relays agent <-> broker (the broker answers it, through rport), and rewrites
    offers and answers with fresh key pairs of its own. It does not know the users'
    passwords, so it cannot finish the key schedule: the test checks that this is
    enough to keep every notification from it and from the agent.
    """

    def __init__(self, broker: tuple[str, int]) -> None:
        self.broker = broker
        self.port = 0
        self.client: tuple[str, int] | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.rewritten = {"offer": 0, "answer": 0}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # a datagram transport (not a DatagramTransport subclass)
        self.port = transport.get_extra_info("sockname")[1]

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        source = (str(addr[0]), int(addr[1]))
        send = getattr(self.transport, "sendto")  # noqa: B009 - typed as BaseTransport
        if source == self.broker:
            if self.client is not None:
                # The broker's Contact names the attacker, so in-dialog requests (the
                # re-INVITE of a re-key) come through it too.
                ours = f"{self.broker[0]}:{self.port}".encode()
                data = data.replace(f"{self.broker[0]}:{self.broker[1]}".encode(), ours)
                send(self._swap(data, "answer"), self.client)
        else:
            self.client = source
            send(self._swap(data, "offer"), self.broker)

    def _swap(self, data: bytes, kind: str) -> bytes:
        own = KeyExchange(secrets.token_bytes(32))  # a fresh value of the attacker's own
        value = encode_key(own.public).encode()  # same length: Content-Length still holds
        out, n = _KX.subn(b"a=mdeci-kx:" + value, data)
        self.rewritten[kind] += n
        return out


async def test_rewritten_sdp_key_values_fail_closed_on_both_sides(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    broker = await start_broker(tmp_path, store, clock, sink, key_confirm_timeout=1.0)
    loop = asyncio.get_running_loop()
    transport, mitm = await loop.create_datagram_endpoint(
        lambda: SdpRewriter(broker.sip_addr), local_addr=("127.0.0.1", 0)
    )
    proxy_port = transport.get_extra_info("sockname")[1]
    marker = b"MITM-" + secrets.token_hex(12).encode()
    capture = LoopbackCapture(ports={broker.media_addr[1], proxy_port}).open()
    alice_direct = agent_config(tmp_path / "alice", "alice", "127.0.0.2", broker.sip_addr[1])
    bob = Agent(
        agent_config(tmp_path / "bob", "bob", "127.0.0.4", broker.sip_addr[1]),
        address_source=lo_only,
    )
    alice = Agent(alice_direct, address_source=lo_only)
    try:
        # Alice subscribes over a clean path, leaves; a notification waits in her queue.
        await alice.start()
        await bob.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        await asyncio.wait_for(bob.wait_connected(), GUARD)
        await asyncio.wait_for(alice.subscribe("mitm.*"), GUARD)
        await alice.close()
        await asyncio.wait_for(bob.publish("mitm.x", {"k": 1}, marker), GUARD)
        assert store.queues.depth(ALICE) == 1
        # She comes back through the attacker (her SIP path), which rewrites both SDPs.
        via_mitm = dataclasses.replace(
            alice_direct,
            registrar=dataclasses.replace(
                alice_direct.registrar, address=HostPort("127.0.0.1", proxy_port)
            ),
            broker=dataclasses.replace(
                alice_direct.broker, address=HostPort("127.0.0.1", proxy_port)
            ),
        )
        alice = Agent(via_mitm, address_source=lo_only, response_timeout=1.0)
        await alice.start()

        # The agent reports the failure: its probe gets no authentic answer.
        def reported() -> bool:
            return any(
                r.name == "mdeci.agent" and "altered on the path" in r.getMessage()
                for r in caplog.records
            )

        await asyncio.wait_for(alice.wait_until(reported), GUARD)
        assert alice.status().status is Status.DISCONNECTED
        # The broker logs it and ends the session.
        ended = await asyncio.wait_for(sink.wait_for("session_ended", ALICE, count=2), GUARD)
        assert ended.fields["reason"] == "key mismatch"
        assert alice.delivered_since(0) == []  # nothing reached the agent
        assert store.queues.depth(ALICE) == 1  # nor anyone else: it waits, unacknowledged
    finally:
        await alice.close(clean=False)
        await bob.close()
        transport.close()
        await broker.close()
        capture.close()
    assert mitm.rewritten["offer"] >= 1 and mitm.rewritten["answer"] >= 1
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        r.name == "mdeci.broker" and "key agreement" in r.getMessage() for r in caplog.records
    ), messages
    assert any(
        r.name == "mdeci.agent" and "altered on the path" in r.getMessage() for r in caplog.records
    ), messages
    # Nothing of the notification is readable on the wire (SIP through the attacker,
    # RUDP to the broker's media port) either.
    assert capture.datagrams
    assert not any(marker in d.payload for d in capture.datagrams)
