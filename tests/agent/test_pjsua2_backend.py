"""The pjsua2 SIP backend: its SDP layout, and that nothing pjsua2 does can
end the daemon (the pjsua2 child dying is a lost session the agent recovers from).

The end-to-end suites run on both backends (tests/e2e, the ``sip_stack`` fixture)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.agent import Agent, Status
from mdeci.agent.errors import AgentError
from mdeci.agent.events import Invite, MoveSip, Register
from mdeci.agent.pjsua2_backend import Pjsua2Backend, outcome_of, worker_settings
from mdeci.config import AgentConfig
from mdeci.store.repo import BrokerStore
from sip.sdp import build_offer, parse_session
from tests.agent.farend import GUARD, agent_config, lo_only
from tests.agent.test_real_broker import start_broker
from tests.broker.conftest import FakeClock, WaitingSink
from tests.keyx import OfferKeys
from tests.peers import missing

pytestmark = pytest.mark.peer("pjsua2")
ALICE = "sip:alice@localhost"


@pytest.fixture(autouse=True)
def _pjsua2() -> None:
    try:
        import pjsua2  # noqa: F401
    except ImportError:
        missing("pjsua2 (PJSIP Python binding)", "pip install pjsua2-python")


def pjsua2_config(tmp: Path, user: str, host: str, port: int) -> AgentConfig:
    config = agent_config(tmp / user, user, host, port)
    return dataclasses.replace(config, sip=dataclasses.replace(config.sip, stack="pjsua2"))


OFFER = (
    "v=0\r\no=alice 1 1 IN IP4 127.0.0.2\r\ns=mdeci\r\nc=IN IP4 127.0.0.2\r\nt=0 0\r\n"
    "m=application 40000 UDP/MDECI-RUDP mdeci\r\na=mdeci-version:2\r\n"
)


def test_the_offer_gets_an_inactive_audio_line_before_ours() -> None:
    from mdeci.agent.pjsua2_worker import with_placeholder

    sdp = with_placeholder(OFFER)
    lines = sdp.split("\r\n")
    media = [line for line in lines if line.startswith("m=")]
    assert media == ["m=audio 9 RTP/AVP 0", "m=application 40000 UDP/MDECI-RUDP mdeci"]
    assert lines[lines.index(media[0]) + 2] == "a=inactive"
    assert sdp.startswith(OFFER.split("m=")[0]) and sdp.endswith("a=mdeci-version:2\r\n")
    # Our parser still finds the application line and its address.
    session = parse_session(sdp.encode())
    assert (session.addr, session.port) == ("127.0.0.2", 40000)


def test_registrar_contacts_are_read_from_the_response() -> None:
    from mdeci.agent.pjsua2_worker import contact_hostports

    response = (
        "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.2:5060\r\n"
        "Contact: <sip:alice@127.0.0.2:5060;ob>;expires=600, <sip:alice@127.0.0.9:7000>\r\n"
        "m: <sip:alice@[::1]:5070>\r\nContent-Length: 0\r\n\r\n"
    )
    assert contact_hostports(response) == [
        ("sip:alice@127.0.0.2:5060", "127.0.0.2:5060"),
        ("sip:alice@127.0.0.9:7000", "127.0.0.9:7000"),
        ("sip:alice@[::1]:5070", "[::1]:5070"),
    ]


async def test_pjsua2_dying_ends_the_session_not_the_daemon(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    broker = await start_broker(tmp_path, store, clock, sink)
    port = broker.sip_addr[1]
    alice = Agent(pjsua2_config(tmp_path, "alice", "127.0.0.2", port), address_source=lo_only)
    bob = Agent(pjsua2_config(tmp_path, "bob", "127.0.0.4", port), address_source=lo_only)
    try:
        await alice.start()
        await bob.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        await asyncio.wait_for(bob.wait_connected(), GUARD)
        status = alice.status()
        assert (status.sip_stack, status.sip_transport) == ("pjsua2", "udp")
        assert status.sip_contact == f"sip:alice@{status.sip_addr}"
        # At least the REGISTER's and the INVITE's final answers.
        assert status.sip_received["udp"] >= 2
        await asyncio.wait_for(alice.subscribe("stocks.*"), GUARD)
        inbox = alice.listen()
        await asyncio.wait_for(bob.publish("stocks.br", {"n": 1}, b"1"), GUARD)
        assert (await asyncio.wait_for(inbox.get(), GUARD))["text"] == "1"

        # What a PJSIP assertion does to its process (we started it, through alice).
        backend = alice.backend
        assert isinstance(backend, Pjsua2Backend) and backend.pid is not None
        first = backend.pid
        os.kill(first, signal.SIGKILL)
        await asyncio.wait_for(alice.wait_event("session_ended", reason="bye from broker"), GUARD)
        # A fresh pjsua2 process, registered again, and a new session.
        await asyncio.wait_for(alice.wait_event("session_started", count=2), GUARD)
        assert backend.pid is not None and backend.pid != first
        # Counted across both processes.
        assert alice.status().sip_received["udp"] >= status.sip_received["udp"] + 2
        await asyncio.wait_for(bob.publish("stocks.br", {"n": 2}, b"2"), GUARD)
        got = await asyncio.wait_for(inbox.get(), GUARD)
        assert (got["nseq"], got["text"]) == (2, "2")
        assert alice.status().status is Status.CONNECTED
    finally:
        await alice.close()
        await bob.close()
        await broker.close()


async def test_a_wrong_password_is_an_auth_failure(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    broker = await start_broker(tmp_path, store, clock, sink)
    config = pjsua2_config(tmp_path, "alice", "127.0.0.2", broker.sip_addr[1])
    alice = Agent(dataclasses.replace(config, password="wrong"), address_source=lo_only)
    try:
        await alice.start()
        await asyncio.wait_for(
            alice.wait_until(lambda: alice.status().alerts.get("auth", 0) > 0), GUARD
        )
        assert alice.status().status is Status.DISCONNECTED
    finally:
        await alice.close()
        await broker.close()


async def test_moves_leave_one_binding_and_keep_the_session(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    """More moves than the registrar's binding cap (16): pjsua's acc.modify removes each
    old contact, and every move re-INVITEs the same dialog on the agreed keys."""
    broker = await start_broker(tmp_path, store, clock, sink)
    port = broker.sip_addr[1]
    alice = Agent(pjsua2_config(tmp_path, "alice", "127.0.0.2", port), address_source=lo_only)
    hosts = [f"127.0.0.{n}" for n in (3, 5, 6, 7)]
    try:
        await alice.start()
        await asyncio.wait_for(alice.wait_connected(), GUARD)
        call_id = alice.status().call_id
        for k in range(20):
            host = hosts[k % len(hosts)]
            await asyncio.wait_for(alice.move_to(host), GUARD)
            status = alice.status()
            assert status.status is Status.CONNECTED and status.sip_addr.startswith(host + ":")
            assert status.call_id == call_id
            contacts = [b.contact for b in store.bindings.bindings(ALICE, clock())]
            assert len(contacts) == 1 and f"@{host}:" in contacts[0], contacts
        await asyncio.wait_for(alice.wait_event("session_reinvited", count=20), GUARD)
        assert alice.status().alerts == {}
    finally:
        await alice.close()
        await broker.close()


async def test_moves_while_unregistered_do_not_run_out_of_transports(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    """A device that changes address while it cannot register (registrar away, a move
    before the last one's re-INVITE ended): each move opens a SIP transport, and pjsua
    holds at most a few. Only a successful re-INVITE closed the old ones, so after eight
    such moves every further one failed (PJ_ETOOMANY) and the agent stayed DISCONNECTED
    for good (found by the 100-move handover test on a loaded machine)."""
    broker = await start_broker(tmp_path, store, clock, sink)
    config = pjsua2_config(tmp_path, "alice", "127.0.0.2", broker.sip_addr[1])
    backend = Pjsua2Backend(config, os.urandom)
    hosts = [f"127.0.0.{n}" for n in (3, 5, 6, 7)]
    try:
        await backend.start(lambda call_id: None)
        for k in range(24):
            host = hosts[k % len(hosts)]
            outcome = await backend.execute(MoveSip(host), timeout=GUARD)
            assert outcome.ok, (k, outcome.reason)
            assert outcome.local_addr is not None and outcome.local_addr[0] == host
        # Still a working UA: it registers from where it is now.
        registered = await backend.execute(Register(60), timeout=GUARD)
        assert registered.ok, registered.reason
        contacts = [b.contact for b in store.bindings.bindings(ALICE, clock())]
        assert len(contacts) == 1 and f"@{hosts[23 % len(hosts)]}:" in contacts[0], contacts
    finally:
        await backend.close()
        await broker.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(deadline=None)  # a shared, loaded machine: no per-example time limit
@given(
    st.dictionaries(
        st.sampled_from(
            ["id", "status", "reason", "body", "offer", "call_id", "local", "contacts"]
        ),
        json_values,
    )
)
def test_any_reply_of_the_child_reads_as_an_outcome(reply: dict[str, Any]) -> None:
    outcome = outcome_of(reply)
    assert outcome.status is None or isinstance(reply.get("status"), int)
    assert outcome.local_addr is None or isinstance(outcome.local_addr[1], int)


@settings(deadline=None)
@given(st.text())
def test_any_register_response_gives_contacts_or_none(message: str) -> None:
    from mdeci.agent.pjsua2_worker import contact_hostports

    for uri, hostport in contact_hostports(message):
        assert isinstance(uri, str) and isinstance(hostport, str)


def test_the_first_transport_is_the_one_pjsua_is_told_to_use(tmp_path: Path) -> None:
    config = pjsua2_config(tmp_path, "alice", "127.0.0.2", 5060)
    for transports, param in ((("udp", "tcp"), ""), (("tcp",), ";transport=tcp"),
                              (("tls", "udp"), ";transport=tls")):  # fmt: skip
        other = dataclasses.replace(
            config, sip=dataclasses.replace(config.sip, transports=transports)
        )
        backend = Pjsua2Backend(other, os.urandom)
        settings = worker_settings(other)
        assert backend.transport == settings["transport"] == transports[0]
        assert settings["registrar"] == f"127.0.0.1:5060{param}"
        assert settings["broker_target"] == f"sip:broker@127.0.0.1:5060{param}"


def test_a_tls_listener_is_refused(tmp_path: Path) -> None:
    # pjsua2 connects out over TLS; a certificate of its own would be ignored silently.
    config = pjsua2_config(tmp_path, "alice", "127.0.0.2", 5060)
    sip = dataclasses.replace(
        config.sip, transports=("tls",), tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem"
    )
    with pytest.raises(AgentError, match="does not listen for TLS"):
        Pjsua2Backend(dataclasses.replace(config, sip=sip), os.urandom)


async def test_a_new_invite_over_a_live_call_is_answered_by_the_new_call(
    tmp_path: Path, store: BrokerStore, clock: FakeClock, sink: WaitingSink
) -> None:
    """The core INVITEs anew while pjsua still holds the last call (the broker stopped
    answering keepalives: restarted). The child hangs that call up first; its end must
    not answer the new INVITE. It did: the INVITE failed although the broker answered
    200, the core tried again, the retry hung up the call the broker had just set up,
    and so on for as long as the test waited (a broker-restart test, now and then)."""
    broker = await start_broker(tmp_path, store, clock, sink)
    config = pjsua2_config(tmp_path, "alice", "127.0.0.2", broker.sip_addr[1])
    backend = Pjsua2Backend(config, os.urandom)
    try:
        host, _port = await backend.start(lambda call_id: None)
        assert (await backend.execute(Register(600), timeout=GUARD)).ok
        call_ids = []
        for version in (1, 2):
            keys = OfferKeys("alice", "localhost", "alice-secret")
            offer = build_offer("alice", 1, version, host, 40000 + version, keys.public)
            outcome = await backend.execute(Invite(offer.encode()), timeout=GUARD)
            # The new call's answer: its Call-ID and SDP (the old call's end said 200 OK
            # too, the status of its BYE, with neither).
            assert outcome.ok and outcome.call_id and outcome.body, outcome
            call_ids.append(outcome.call_id)
        assert call_ids[0] != call_ids[1]
        assert parse_session(outcome.body).port == broker.media_addr[1]
        # The broker saw the first session end (the child's BYE) and the second start.
        ended = await asyncio.wait_for(sink.wait_for("session_ended", ALICE), GUARD)
        assert ended.fields["call_id"] == call_ids[0]
    finally:
        await backend.close()
        await broker.close()
