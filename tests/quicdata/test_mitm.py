"""A party in the middle that rewrote the SDP (its own fingerprint in the answer) and
terminates QUIC with its own certificate, relaying the stream both ways: no frame gets
through, the agent's frames never leave it, and both real ends log the failure."""

from __future__ import annotations

import datetime
import logging
import ssl

import pytest
from aioquic.quic import events as quic_events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from quicdata.binding import ALPN, ServerCertificate
from quicdata.connection import QuicDataConfig, client
from quicdata.endpoint import ServerCore
from quicdata.events import Address, Connected, PeerDisconnected, QuicDataEvent
from quicdata.framing import encode
from tests.quicdata.net import SECRET, certificate

AGENT: Address = ("198.51.100.7", 50000)
MITM: Address = ("203.0.113.66", 4433)  # where the rewritten SDP sends the agent
MITM_OUT: Address = ("203.0.113.66", 61000)
BROKER: Address = ("192.0.2.1", 4433)
MARKER = b"marker-7d1c-must-not-leave-the-agent"


def test_a_relaying_man_in_the_middle_gets_no_frame_and_both_ends_log_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = 1000.0
    config = QuicDataConfig(proof_timeout=5.0)
    fake = ServerCertificate.generate(datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    agent = client(SECRET, fake.fingerprint, MITM, now, config)  # the SDP says: fake's
    agent.send_message(MARKER)
    expected = agent.session_id
    broker = ServerCore(certificate(), lambda sid: SECRET if sid == expected else None, config)

    server_config = QuicConfiguration(alpn_protocols=[ALPN], is_client=False)
    server_config.certificate, server_config.private_key = fake.certificate, fake.private_key
    mitm_in: QuicConnection | None = None  # created on the agent's first Initial
    mitm_out = QuicConnection(
        configuration=QuicConfiguration(alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE)
    )
    mitm_out.connect(BROKER, now)
    from_agent = bytearray()  # what the middle reads from the agent's stream
    agent_events: list[QuicDataEvent] = []
    broker_events: list[QuicDataEvent] = []
    forged = False

    with caplog.at_level(logging.WARNING, logger="quicdata"):
        for _ in range(400):
            now += 0.01
            for conn in [agent, *broker.connections]:
                timer = conn.get_timer()
                if timer is not None and now >= timer:
                    conn.handle_timer(now)
            for quic in [q for q in (mitm_in, mitm_out) if q is not None]:
                timer = quic.get_timer()
                if timer is not None and now >= timer:
                    quic.handle_timer(now)
            for data, _ in agent.datagrams_to_send(now):
                if mitm_in is None:
                    # The Initial's destination id: after flags, version and its length.
                    mitm_in = QuicConnection(
                        configuration=server_config,
                        original_destination_connection_id=data[6:14],
                    )
                mitm_in.receive_datagram(data, AGENT, now)
            for data, _ in mitm_out.datagrams_to_send(now):
                broker.receive(data, MITM_OUT, now)
            for conn in list(broker.connections):
                for data, _ in conn.datagrams_to_send(now):
                    mitm_out.receive_datagram(data, BROKER, now)
                while (event := conn.next_event()) is not None:
                    broker_events.append(event)
            if mitm_in is not None:
                for data, _ in mitm_in.datagrams_to_send(now):
                    agent.receive_datagram(data, MITM, now)
                while (qe := mitm_in.next_event()) is not None:
                    if isinstance(qe, quic_events.StreamDataReceived):
                        from_agent.extend(qe.data)
                        mitm_out.send_stream_data(0, qe.data)  # relay the agent's proof
            while (qe := mitm_out.next_event()) is not None:
                terminated = isinstance(qe, quic_events.ConnectionTerminated)
                if terminated and mitm_in is not None and not forged:
                    # The broker refused the relayed proof: try a made-up one on the agent.
                    forged = True
                    mitm_in.send_stream_data(0, encode(bytes(32)))
            while (event := agent.next_event()) is not None:
                agent_events.append(event)

    assert MARKER not in from_agent
    assert len(from_agent) == 4 + 8 + 32  # the agent's proof only
    assert not any(isinstance(e, Connected) for e in agent_events + broker_events)
    assert broker_events == [
        PeerDisconnected("the agent's key proof failed (it does not hold the session key)")
    ]
    assert forged
    assert agent_events == [
        PeerDisconnected("the broker's key proof failed (it does not hold the session key)")
    ]
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("quic server") and "key proof failed" in line for line in lines)
    assert any(line.startswith("quic client") and "key proof failed" in line for line in lines)
