"""The data channel's offer/answer decisions, sans-IO (docs/sip.md): the agent's offer for
each ``[media] transport``, the broker's answer for each ``[media] transports``
(RFC 3264 §6: one line accepted, every other refused with port 0; none: 488), and the
agent's reading of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdeci.agent.offer import SessionKeys, offered_transports, read_answer, session_offer
from mdeci.broker.media_answer import DataChannels, answer_offer, read_offer
from mdeci.config import (
    AgentMediaConfig,
    BrokerMediaConfig,
    load_agent_config,
    load_broker_config,
)
from mdeci.errors import ConfigError
from quicdata.connection import QuicDataConfig
from sip.errors import SdpError
from sip.sdp import TRANSPORTS

AGENT_KX = bytes(range(32))
BROKER_KX = bytes(range(32, 64))
FINGERPRINT = bytes(range(100, 132))
RUDP_ADDR = ("192.0.2.1", 6000)
QUIC_ADDR = ("192.0.2.1", 6001)
AGENT_MEDIA = ("192.0.2.5", 5004)

choices = st.sampled_from(["rudp", "quic", "auto"])
accepts = st.lists(st.sampled_from(["rudp", "quic"]), min_size=1, max_size=2, unique=True)


def channels(accept: tuple[str, ...]) -> DataChannels:
    if "quic" in accept:
        return DataChannels(accept, RUDP_ADDR, QUIC_ADDR, FINGERPRINT)
    return DataChannels(accept, RUDP_ADDR)


def offer_of(choice: str) -> bytes:
    return session_offer("alice", "7", 1, AGENT_MEDIA, AGENT_KX, None, offered_transports(choice))


def mlines(text: str) -> list[tuple[int, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("m="):
            _, port, proto, _ = line[2:].split(" ", 3)
            out.append((int(port), proto))
    return out


def test_each_choice_offers_its_lines_in_the_order_of_preference() -> None:
    assert offered_transports("rudp") == ("rudp",)
    assert offered_transports("quic") == ("quic",)
    assert offered_transports("auto") == ("quic", "rudp")
    assert [p for _, p in mlines(offer_of("auto").decode())] == [
        TRANSPORTS["quic"],
        TRANSPORTS["rudp"],
    ]
    with pytest.raises(ValueError, match="transport"):
        offered_transports("tcp")


@given(choices, accepts)
def test_the_answer_accepts_the_first_offered_line_the_broker_takes_or_488(
    choice: str, accept_list: list[str]
) -> None:
    accept = tuple(accept_list)
    offered = offered_transports(choice)
    offer = offer_of(choice)
    wanted = [t for t in offered if t in accept]
    if not wanted:
        with pytest.raises(SdpError) as caught:
            read_offer(offer, channels(accept))
        assert caught.value.status == 488
        with pytest.raises(SdpError):
            answer_offer(offer, "broker", (9, 1), channels(accept), BROKER_KX, "s1")
        return
    media = read_offer(offer, channels(accept))
    assert media.transport == wanted[0] and media.key == AGENT_KX
    answer = answer_offer(offer, "broker", (9, 1), channels(accept), BROKER_KX, "s1")
    lines = mlines(answer)
    assert [p for _, p in lines] == [TRANSPORTS[t] for t in offered]  # same lines, same order
    accepted = [(port, proto) for port, proto in lines if port != 0]
    expected_port = (QUIC_ADDR if wanted[0] == "quic" else RUDP_ADDR)[1]
    assert accepted == [(expected_port, TRANSPORTS[wanted[0]])]  # one, the others port 0
    got = read_answer(answer.encode(), offered)
    assert got.transport == wanted[0]
    assert got.media == (RUDP_ADDR[0], expected_port)
    assert got.public == BROKER_KX and got.store_id == "s1"
    assert got.fingerprint == (FINGERPRINT if wanted[0] == "quic" else None)
    attach = got.attach(b"k" * 32)
    assert (attach.transport, attach.fingerprint) == (got.transport, got.fingerprint)


def test_the_agent_refuses_an_answer_on_a_transport_it_did_not_offer() -> None:
    # A broker (or a party on the path) answering QUIC to an agent set to RUDP only.
    answer = answer_offer(offer_of("quic"), "broker", (9, 1), channels(("quic",)), BROKER_KX, "s")
    with pytest.raises(SdpError):
        read_answer(answer.encode(), offered_transports("rudp"))


def test_the_agent_refuses_a_quic_answer_without_a_fingerprint() -> None:
    answer = answer_offer(offer_of("quic"), "broker", (9, 1), channels(("quic",)), BROKER_KX, "s")
    stripped = "\r\n".join(
        line for line in answer.splitlines() if not line.startswith("a=fingerprint")
    )
    with pytest.raises(SdpError, match="fingerprint"):
        read_answer(stripped.encode(), ("quic",))


def test_session_keys_offer_what_the_config_names_and_read_the_answer() -> None:
    keys = SessionKeys("alice", "example.org", "pw", None, bytes, "auto")
    offer = keys.offer(AGENT_MEDIA)
    assert [p for _, p in mlines(offer.decode())] == [TRANSPORTS["quic"], TRANSPORTS["rudp"]]
    answer = answer_offer(offer, "broker", (9, 1), channels(("rudp",)), BROKER_KX, "s")
    assert keys.read_answer(answer.encode()).transport == "rudp"


def test_a_broker_accepting_quic_needs_its_server() -> None:
    with pytest.raises(ValueError, match="QUIC"):
        DataChannels(("quic",), RUDP_ADDR)


def test_config_names_the_transports() -> None:
    assert AgentMediaConfig().transport == "rudp"
    assert BrokerMediaConfig().transports == ("rudp",)
    AgentMediaConfig(transport="auto")
    BrokerMediaConfig(transports=("quic", "rudp"))
    with pytest.raises(ConfigError, match="transport"):
        AgentMediaConfig(transport="tcp")
    with pytest.raises(ConfigError, match="transports"):
        BrokerMediaConfig(transports=())
    with pytest.raises(ConfigError, match="transports"):
        BrokerMediaConfig(transports=("rudp", "sctp"))
    with pytest.raises(ConfigError, match="repeats"):
        BrokerMediaConfig(transports=("quic", "quic"))


def test_toml_names_the_transports(tmp_path: Path) -> None:
    agent = tmp_path / "agent.toml"
    agent.write_text(
        'aor = "sip:alice@example.org"\npassword = "pw"\n[media]\ntransport = "auto"\n'
    )
    assert load_agent_config(agent, env={}).media.transport == "auto"
    broker = tmp_path / "broker.toml"
    broker.write_text('[media]\ntransports = ["quic", "rudp"]\nquic_port = 7001\n')
    media = load_broker_config(broker, env={}).media
    assert (media.transports, media.quic_port) == (("quic", "rudp"), 7001)
    broker.write_text('[media]\ntransports = ["tcp"]\n')
    with pytest.raises(ConfigError, match="transports"):
        load_broker_config(broker, env={})


def test_toml_sets_the_quic_timers_of_either_side(tmp_path: Path) -> None:
    agent = tmp_path / "agent.toml"
    agent.write_text(
        'aor = "sip:alice@example.org"\npassword = "pw"\n[media]\ntransport = "quic"\n'
        "quic_idle_timeout = 2.0\nquic_keepalive = 0.5\n"
    )
    quic = load_agent_config(agent, env={}).media.quic
    assert (quic.idle_timeout, quic.keepalive) == (2.0, 0.5)
    assert BrokerMediaConfig().quic == QuicDataConfig()  # QUIC's defaults: 30 s and 10 s
    with pytest.raises(ConfigError, match="quic_keepalive"):
        BrokerMediaConfig(quic_idle_timeout=1.0, quic_keepalive=1.0)
    with pytest.raises(ConfigError, match="quic_keepalive"):
        AgentMediaConfig(quic_keepalive=0.0)
