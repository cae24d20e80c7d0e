"""The data channel's transport in SDP: RUDP and QUIC lines in offers, the answer's
choice (RFC 3264 §6: one accepted, the others refused with port 0), and its reading."""

from __future__ import annotations

import pytest

from sip.errors import SdpError
from sip.sdp import MDECI_PROTO, MDECI_QUIC_PROTO, build_answer, build_offer, parse_session

KEY = bytes(range(32))
BROKER_KEY = bytes(range(32, 64))
FINGERPRINT = bytes(range(100, 132))
BOTH = ("rudp", "quic")


def offer(transports: tuple[str, ...]) -> str:
    return build_offer("alice", 7, 1, "192.0.2.5", 5004, KEY, transports=transports, quic_port=5005)


def answer(offer_text: str, accept: tuple[str, ...]) -> str:
    return build_answer(
        offer_text, "broker", 9, 1, "192.0.2.1", 6000, key=BROKER_KEY,
        accept=accept, quic_port=6001, fingerprint=FINGERPRINT,
    )  # fmt: skip


def mlines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("m=")]


def test_a_rudp_offer_is_what_it_was() -> None:
    plain = build_offer("alice", 7, 1, "192.0.2.5", 5004, KEY)
    assert offer(("rudp",)) == plain
    assert mlines(plain) == [f"m=application 5004 {MDECI_PROTO} mdeci"]


def test_auto_offers_both_lines_in_the_order_of_preference_with_one_key() -> None:
    text = offer(("quic", "rudp"))
    assert mlines(text) == [
        f"m=application 5005 {MDECI_QUIC_PROTO} mdeci",
        f"m=application 5004 {MDECI_PROTO} mdeci",
    ]
    assert text.count("a=mdeci-kx:") == 2
    assert len(set(line for line in text.splitlines() if "mdeci-kx" in line)) == 1
    assert "fingerprint" not in text  # the agent presents no certificate


def test_a_rudp_only_broker_accepts_the_rudp_line_of_an_auto_offer() -> None:
    text = answer(offer(("quic", "rudp")), accept=("rudp",))
    assert mlines(text) == [
        f"m=application 0 {MDECI_QUIC_PROTO} mdeci",
        f"m=application 6000 {MDECI_PROTO} mdeci",
    ]
    media = parse_session(text, transports=BOTH)
    assert (media.transport, media.port, media.fingerprint) == ("rudp", 6000, None)
    assert media.key == BROKER_KEY
    assert "fingerprint" not in text


def test_a_quic_only_broker_accepts_the_quic_line_with_its_fingerprint() -> None:
    text = answer(offer(("rudp", "quic")), accept=("quic",))
    assert mlines(text) == [
        f"m=application 0 {MDECI_PROTO} mdeci",
        f"m=application 6001 {MDECI_QUIC_PROTO} mdeci",
    ]
    assert "a=fingerprint:sha-256 64:65:66:" in text
    media = parse_session(text, transports=BOTH)
    assert (media.transport, media.port, media.fingerprint) == ("quic", 6001, FINGERPRINT)
    assert media.key == BROKER_KEY


def test_a_broker_taking_both_follows_the_offers_preference() -> None:
    assert parse_session(answer(offer(BOTH), BOTH), transports=BOTH).transport == "rudp"
    assert parse_session(answer(offer(("quic", "rudp")), BOTH), transports=BOTH).transport == (
        "quic"
    )


@pytest.mark.parametrize(("offered", "accept"), [(("quic",), ("rudp",)), (("rudp",), ("quic",))])
def test_a_broker_accepting_none_of_the_offered_transports_refuses_with_488(
    offered: tuple[str, ...], accept: tuple[str, ...]
) -> None:
    with pytest.raises(SdpError, match="no usable m=application") as caught:
        answer(offer(offered), accept)
    assert caught.value.status == 488


def test_readers_that_know_only_rudp_do_not_take_a_quic_line() -> None:
    text = answer(offer(("quic",)), ("quic",))
    with pytest.raises(SdpError):
        parse_session(text)


def test_a_malformed_fingerprint_is_refused() -> None:
    text = answer(offer(("quic",)), ("quic",)).replace("64:65:66:", "64:65:6G:")
    with pytest.raises(SdpError, match="fingerprint"):
        parse_session(text, transports=BOTH)


def test_accepting_quic_needs_its_port_and_fingerprint() -> None:
    with pytest.raises(ValueError, match="quic_port and fingerprint"):
        build_answer(offer(BOTH), "broker", 9, 1, "192.0.2.1", 6000, accept=("quic",))
    with pytest.raises(ValueError, match="quic_port"):
        build_offer("alice", 7, 1, "192.0.2.5", 5004, KEY, transports=("quic",))
    with pytest.raises(ValueError, match="transports"):
        build_offer("alice", 7, 1, "192.0.2.5", 5004, KEY, transports=("tcp",))
