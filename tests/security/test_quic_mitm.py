"""An on-path attacker against the QUIC data channel, with the real agent and broker.

The attacker relays SIP, rewrites both SDPs (its own ``a=mdeci-kx`` values; in the
answer its own certificate fingerprint and its own QUIC port) and terminates QUIC with
its own certificate, relaying the stream to the broker over a connection of its own.
TLS succeeds on both legs (the agent checks the fingerprint the attacker wrote), but
neither end's key proof does: nothing is delivered, nothing of the agent's frames
leaves it, and both ends log the failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import re
import secrets
import ssl
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer, serve
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, QuicEvent, StreamDataReceived

from mdeci.agent import Agent, Status
from mdeci.config import HostPort
from mdeci.store.repo import BrokerStore
from quicdata.binding import ALPN, ServerCertificate, format_fingerprint
from quicdata.framing import encode
from tests.agent.farend import GUARD, agent_config, lo_only
from tests.broker.conftest import FakeClock, WaitingSink
from tests.security.test_wire import ALICE, SdpRewriter, _on, start_broker

_QUIC_LINE = re.compile(rb"m=application (\d+) UDP/MDECI-QUIC")
_FINGERPRINT = re.compile(rb"a=fingerprint:sha-256 ([0-9A-F:]{95})")
_LENGTH = re.compile(rb"\r\nContent-Length: *\d+\r\n", re.IGNORECASE)


class QuicTerminator:
    """The attacker's QUIC: a server with its own certificate for the agent, and a
    client of the broker's server; the stream's bytes go across both ways."""

    def __init__(self) -> None:
        self.cert = ServerCertificate.generate(datetime.datetime.now(datetime.UTC))
        self.broker: tuple[str, int] | None = None  # learnt from the answer
        self.from_agent = bytearray()
        self.from_broker = bytearray()
        self.forged = False
        self.port = 0
        self._server: QuicServer | None = None
        self._agent_side: QuicConnectionProtocol | None = None
        self._broker_side: QuicConnectionProtocol | None = None
        self._upstream: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def open(self) -> QuicTerminator:
        config = QuicConfiguration(alpn_protocols=[ALPN], is_client=False)
        config.certificate, config.private_key = self.cert.certificate, self.cert.private_key
        terminator = self

        class AgentSide(QuicConnectionProtocol):
            def quic_event_received(self, event: QuicEvent) -> None:
                terminator._agent_side = self
                if isinstance(event, StreamDataReceived):
                    terminator._from_agent(event.data)

        self._server = await serve("127.0.0.1", 0, configuration=config, create_protocol=AgentSide)
        self.port = self._server._transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        return self

    def _from_agent(self, data: bytes) -> None:
        self.from_agent.extend(data)
        if self._upstream is None and self.broker is not None:
            self._upstream = asyncio.create_task(self._connect(self.broker))
        self._forward()

    async def _connect(self, broker: tuple[str, int]) -> None:
        terminator = self

        class BrokerSide(QuicConnectionProtocol):
            def quic_event_received(self, event: QuicEvent) -> None:
                side = terminator._agent_side
                if isinstance(event, StreamDataReceived):
                    terminator.from_broker.extend(event.data)
                    payload = event.data
                elif isinstance(event, ConnectionTerminated) and not terminator.forged:
                    # The broker refused the relayed proof: a made-up one for the agent.
                    terminator.forged = True
                    payload = encode(bytes(32))
                else:
                    return
                if side is not None:
                    side._quic.send_stream_data(0, payload)
                    side.transmit()

        config = QuicConfiguration(alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE)
        async with connect(*broker, configuration=config, create_protocol=BrokerSide) as side:
            self._broker_side = side
            self._forward()
            await self._stop.wait()

    def _forward(self) -> None:
        """What the agent sent so far and the broker's side has not had yet."""
        side = self._broker_side
        if side is not None and self.from_agent:
            sent = getattr(side, "relayed", 0)
            side._quic.send_stream_data(0, bytes(self.from_agent[sent:]))
            side.relayed = len(self.from_agent)  # type: ignore[attr-defined]
            side.transmit()

    async def close(self) -> None:
        self._stop.set()
        if self._upstream is not None:
            await asyncio.gather(self._upstream, return_exceptions=True)
        if self._server is not None:
            self._server.close()


class QuicSdpRewriter(SdpRewriter):
    """:class:`SdpRewriter`, and in the answer the attacker's QUIC port and fingerprint
    (Content-Length follows the body)."""

    def __init__(self, broker: tuple[str, int], quic: QuicTerminator) -> None:
        super().__init__(broker)
        self.quic = quic

    def _swap(self, data: bytes, kind: str) -> bytes:
        data = super()._swap(data, kind)
        if kind != "answer" or _QUIC_LINE.search(data) is None:
            return data
        port = _QUIC_LINE.search(data)
        assert port is not None
        self.quic.broker = (self.broker[0], int(port.group(1)))
        data = _QUIC_LINE.sub(b"m=application %d UDP/MDECI-QUIC" % self.quic.port, data)
        ours = format_fingerprint(self.quic.cert.fingerprint).encode()
        data, n = _FINGERPRINT.subn(b"a=fingerprint:sha-256 " + ours, data)
        self.rewritten["fingerprint"] = self.rewritten.get("fingerprint", 0) + n
        head, _, body = data.partition(b"\r\n\r\n")
        head = _LENGTH.sub(b"\r\nContent-Length: %d\r\n" % len(body), head + b"\r\n")[:-2]
        return head + b"\r\n\r\n" + body


async def test_a_man_in_the_middle_terminating_quic_gets_nothing_and_both_ends_log_it(
    tmp_path: Path,
    store: BrokerStore,
    clock: FakeClock,
    sink: WaitingSink,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    broker = await start_broker(
        tmp_path, store, clock, sink, key_confirm_timeout=1.0, transport="quic"
    )
    loop = asyncio.get_running_loop()
    quic = await QuicTerminator().open()
    transport, mitm = await loop.create_datagram_endpoint(
        lambda: QuicSdpRewriter(broker.sip_addr, quic), local_addr=("127.0.0.1", 0)
    )
    proxy_port = transport.get_extra_info("sockname")[1]
    marker = b"MITM-" + secrets.token_hex(12).encode()
    alice_direct = _on(
        agent_config(tmp_path / "alice", "alice", "127.0.0.2", broker.sip_addr[1]), "quic"
    )
    bob = Agent(
        _on(agent_config(tmp_path / "bob", "bob", "127.0.0.4", broker.sip_addr[1]), "quic"),
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
        # She comes back through the attacker, on SIP and on QUIC.
        where = HostPort("127.0.0.1", proxy_port)
        via_mitm = dataclasses.replace(
            alice_direct,
            registrar=dataclasses.replace(alice_direct.registrar, address=where),
            broker=dataclasses.replace(alice_direct.broker, address=where),
        )
        alice = Agent(via_mitm, address_source=lo_only, response_timeout=1.0)
        await alice.start()

        def logged(logger: str, text: str) -> bool:
            return any(r.name == logger and text in r.getMessage() for r in caplog.records)

        # The agent: the broker's proof (relayed) fails, and it says the path is altered.
        await asyncio.wait_for(
            alice.wait_until(lambda: logged("mdeci.agent", "altered on the path")), GUARD
        )
        assert alice.status().status is Status.DISCONNECTED
        # The broker: the agent's proof fails, and the session ends unconfirmed.
        ended = await asyncio.wait_for(sink.wait_for("session_ended", ALICE, count=2), GUARD)
        assert ended.fields["reason"] == "key mismatch"
        assert alice.delivered_since(0) == []  # nothing reached the agent
        assert store.queues.depth(ALICE) == 1  # nor anyone else: it waits, unacknowledged
    finally:
        await alice.close(clean=False)
        await bob.close()
        transport.close()
        await quic.close()
        await broker.close()
    assert mitm.rewritten["offer"] >= 1 and mitm.rewritten["fingerprint"] >= 1
    messages: list[Any] = [(r.name, r.getMessage()) for r in caplog.records]
    quic_lines = [m for name, m in messages if name == "quicdata"]
    assert any(m.startswith("quic client") and "key proof" in m for m in quic_lines), messages
    assert any(m.startswith("quic server") and "key proof" in m for m in quic_lines), messages
    # The attacker had TLS with both ends, and still nothing but the agent's proofs
    # (one per connection: a length prefix, the session id, the MAC).
    assert quic.forged and quic.from_agent and len(quic.from_agent) % (4 + 8 + 32) == 0
    assert marker not in quic.from_broker and marker not in quic.from_agent
