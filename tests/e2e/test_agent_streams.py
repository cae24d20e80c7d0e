"""The agent scenario over SIP/TCP and SIP/TLS, without Kamailio.

A broker process listens on UDP, TCP and TLS (a certificate from ``tests/sip/certs.py``);
two ``mdeci agent`` processes are configured with ``[sip] transports = ["tcp"]`` or
``["tls"]`` (with ``tls_ca`` to verify the broker) and the broker's TCP or TLS address,
on either SIP stack (``sip_stack``: ours or pjsua2).
alice subscribes with a filter; bob publishes at ``RATE`` per second while alice moves
``MOVES`` times with ``mdeci move``: 0 lost, 0 duplicated, order kept. Then
``mdeci admin kick`` makes the broker send its own in-dialog request (BYE) to alice: it
arrives over the dialog's stream transport (alice's SIP counters show no UDP message at
all), alice logs ``session_ended`` (``bye from broker``) and comes back over the same
transport. The agents' clean stop BYEs their sessions.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from mdeci.agent.events import Register
from mdeci.agent.pjsua2_backend import Pjsua2Backend
from mdeci.config import HostPort
from tests.agent.farend import GUARD, agent_config
from tests.e2e.harness_a import check_exactly
from tests.e2e.harness_b import (
    AgentProcess,
    ApiPublisher,
    BrokerProcess,
    TailCollector,
    at_least,
    eventually,
    uri,
)
from tests.peers import missing
from tests.sip.certs import make_certs

MOVES = 5
RATE = 50.0
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
SUBJECT = "st.tick"


@pytest.mark.parametrize("transport", ["tcp", "tls"])
async def test_agent_processes_over_a_stream_transport(
    tmp_path: Path, transport: str, sip_stack: str
) -> None:
    certs = make_certs(tmp_path / "certs")
    broker = BrokerProcess(
        tmp_path / "broker",
        sip=(
            'transports = ["udp", "tcp", "tls"]\ntls_port = 0\n'
            f'tls_cert = "{certs.cert}"\ntls_key = "{certs.key}"\n'
        ),
    )
    agents: list[AgentProcess] = []
    tail: TailCollector | None = None
    publisher: ApiPublisher | None = None
    try:
        await broker.start()
        dest = broker.tls_addr if transport == "tls" else broker.sip_addr
        assert dest is not None, "the broker printed no tls= address"
        sip = f'transports = ["{transport}"]\nstack = "{sip_stack}"\n'
        if transport == "tls":
            sip += f'tls_ca = "{certs.ca}"\n'
        alice = AgentProcess(tmp_path / "alice", "alice", HOSTS[0], broker, address=dest, sip=sip)
        bob = AgentProcess(tmp_path / "bob", "bob", "127.0.0.100", broker, address=dest, sip=sip)
        for agent in (alice, bob):
            agents.append(await agent.start())
        for agent in agents:
            await agent.wait_connected()
            status = await agent.status()
            assert status["sip_transport"] == transport

        tail = TailCollector(alice.socket).start()
        await alice.subscribe(SUBJECT, "exists(i)", ttl=600)
        for _ in range(3):  # filtered out: never reaches alice
            await bob.publish(SUBJECT, "noise", noise=1)
        publisher = ApiPublisher(bob, SUBJECT, RATE).start()
        await tail.wait_for(at_least(1))
        for k in range(1, MOVES + 1):
            mark = len(tail.records)
            host = HOSTS[k % len(HOSTS)]
            await alice.move(host)
            assert (await alice.status())["sip_addr"].startswith(f"{host}:")
            # Two notifications at the new address before the next move.
            await tail.wait_for(at_least(mark + 2))
        # Its own earlier bindings are not taken for another device's.
        assert "duplicate_aor" not in (await alice.status())["alerts"]
        sent = await publisher.stop()
        publisher = None
        await tail.wait_for(at_least(sent))
        check_exactly(tail.records, [f"t{i}" for i in range(sent)])
        assert sent >= 2 * MOVES + 1

        # The broker's own in-dialog request: `mdeci admin kick` sends alice a BYE. It
        # goes where the dialog's remote target says (over the stream alice reached it
        # by), never as a UDP datagram.
        before = (await alice.status())["sip_received"]
        code, out, err = await broker.admin("kick", uri("alice"))
        assert code == 0, out + err

        async def bye_seen() -> bool:
            return any(
                r["event"] == "session_ended" and r.get("reason") == "bye from broker"
                for r in alice.churn()
            )

        await eventually(bye_seen)
        await alice.wait_connected()  # back, over the same transport
        after = (await alice.status())["sip_received"]
        assert after[transport] > before[transport]
        for agent in agents:
            received = (await agent.status())["sip_received"]
            assert received.get("udp", 0) == 0 and received[transport] > 0, received
        print(
            f"\n{transport} ({sip_stack}): {MOVES} moves while bob (a process) published {sent}: "
            f"0 lost, 0 duplicated, order kept; kick BYE over {transport}"
        )
    finally:
        if publisher is not None:
            await publisher.stop()
        if tail is not None:
            await tail.close()
        for agent in agents:
            assert await agent.stop() == 0, agent.stderr.decode()
        await broker.stop()


@pytest.mark.peer("pjsua2")
async def test_pjsua2_over_tls_verifies_the_brokers_certificate(tmp_path: Path) -> None:
    """pjsua2 checks the broker's certificate as our stack does: signed by ``tls_ca`` and
    naming the address connected to. Another CA's file, or a certificate for another
    address, and the REGISTER fails (PJSIP_TLS_ECERTVERIF); the right pair, and it is
    answered."""
    # (Our stack's own verification: tests/sip/test_ua_streams.py.)
    try:
        import pjsua2  # noqa: F401
    except ImportError:
        missing("pjsua2 (PJSIP Python binding)", "pip install pjsua2-python")
    ours = make_certs(tmp_path / "ours")
    stranger = make_certs(tmp_path / "stranger")
    elsewhere = make_certs(tmp_path / "elsewhere", ips=("127.0.0.9",))
    answered: dict[str, bool] = {}
    for name, served, ca in (
        ("another CA", ours, stranger.ca),
        ("another address", elsewhere, elsewhere.ca),
        ("ours", ours, ours.ca),
    ):
        broker = BrokerProcess(
            tmp_path / f"broker-{len(answered)}",
            sip=(
                'transports = ["tls"]\ntls_port = 0\n'
                f'tls_cert = "{served.cert}"\ntls_key = "{served.key}"\n'
            ),
        )
        try:
            await broker.start()
            assert broker.tls_addr is not None
            tls = HostPort(*broker.tls_addr)
            base = agent_config(tmp_path / "alice", "alice", "127.0.0.2", tls.port)
            config = dataclasses.replace(
                base,
                registrar=dataclasses.replace(base.registrar, address=tls),
                broker=dataclasses.replace(base.broker, address=tls),
                sip=dataclasses.replace(base.sip, transports=("tls",), tls_ca=ca, stack="pjsua2"),
            )
            backend = Pjsua2Backend(config, os.urandom)
            await backend.start(lambda call_id: None)
            try:
                outcome = await backend.execute(Register(expires=60), timeout=GUARD)
            finally:
                await backend.close()
            answered[name] = outcome.ok
        finally:
            await broker.stop()
    assert answered == {"another CA": False, "another address": False, "ours": True}
