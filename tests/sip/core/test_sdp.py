"""mdeci SDP profile: offers, RFC 3264 answers, reading, and parse-or-SdpError fuzzing."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable

import pytest
import sdp_transform
from hypothesis import given, settings
from hypothesis import strategies as st

from sip.errors import SdpError
from sip.sdp import (
    MDECI_PROTO,
    MdeciMedia,
    SessionDescription,
    build_answer,
    build_offer,
    decode_key,
    encode_key,
    parse_session,
    read_description,
    stored_key,
)

KEY = bytes(range(32))
KEY_TEXT = encode_key(KEY)


def sdp(*lines: str) -> str:
    return "\r\n".join(lines) + "\r\n"


def mlines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("m=")]


# What pjsua sends once onCallSdpCreated rewrote it (docs/pjsip.md), with the
# session-level lines pjsua itself writes.
PJSUA_OFFER = sdp(
    "v=0",
    "o=- 3917495063 3917495064 IN IP4 127.0.0.2",
    "s=pjmedia",
    "b=AS:84",
    "t=0 0",
    "a=X-nat:0",
    "m=audio 4000 RTP/AVP 0",
    "c=IN IP4 127.0.0.2",
    "b=TIAS:64000",
    "a=rtcp:4001 IN IP4 127.0.0.2",
    "a=rtpmap:0 PCMU/8000",
    "a=inactive",
    "m=application 40000 UDP/MDECI-RUDP mdeci",
    "c=IN IP4 127.0.0.2",
    "a=mdeci-version:2",
    f"a=mdeci-kx:{KEY_TEXT}",
    "a=mdeci-msisdn:+5521987654321",
    "a=sendrecv",
)


# ---------------------------------------------------------------- offers


def test_offer_has_the_protocol_shape() -> None:
    text = build_offer("alice", 42, 1, "192.0.2.7", 40000, KEY, msisdn="+4915112345678")
    assert text == sdp(
        "v=0",
        "o=alice 42 1 IN IP4 192.0.2.7",
        "s=mdeci",
        "c=IN IP4 192.0.2.7",
        "t=0 0",
        "m=application 40000 UDP/MDECI-RUDP mdeci",
        "a=mdeci-version:2",
        f"a=mdeci-kx:{KEY_TEXT}",
        "a=mdeci-msisdn:+4915112345678",
        "a=sendrecv",
    )


def test_offer_round_trip_ipv4_and_ipv6() -> None:
    for addr, ipv in (("127.0.0.2", 4), ("2001:db8::5", 6)):
        text = build_offer("alice", "7", 3, addr, 5000, KEY)
        assert f"c=IN IP{ipv} {addr}" in text
        assert parse_session(text) == MdeciMedia(
            addr=addr,
            port=5000,
            key=KEY,
            msisdn=None,
            version=3,
            sess_id="7",
            user="alice",
            index=0,
            ip_version=ipv,
        )


def test_offer_with_audio_placeholder_is_pjsua_shaped() -> None:
    text = build_offer("alice", 1, 1, "127.0.0.2", 40000, KEY, audio_placeholder_port=4000)
    assert mlines(text) == [
        "m=audio 4000 RTP/AVP 0",
        "m=application 40000 UDP/MDECI-RUDP mdeci",
    ]
    audio = text.split("m=audio", 1)[1].split("m=application", 1)[0]
    assert "a=rtpmap:0 PCMU/8000" in audio
    assert "a=inactive" in audio
    assert parse_session(text).index == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"port": 0},
        {"port": 70000},
        {"addr": "broker.example.org"},
        {"key": b"short"},
        {"msisdn": "0800 123"},
        {"user": "two words"},
        {"sess_id": "x1"},
        {"version": -1},
        {"audio_placeholder_port": 65536},
    ],
)
def test_offer_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {
        "user": "alice",
        "sess_id": 1,
        "version": 1,
        "addr": "127.0.0.1",
        "port": 5000,
        "key": KEY,
    }
    args.update(kwargs)
    with pytest.raises(ValueError):
        build_offer(**args)  # type: ignore[arg-type]


# ---------------------------------------------------------------- keys


def test_key_encoding() -> None:
    assert len(KEY_TEXT) == 43 and "=" not in KEY_TEXT
    assert decode_key(KEY_TEXT) == KEY
    padded = base64.urlsafe_b64encode(KEY).decode()
    assert padded.endswith("=")
    assert decode_key(padded) == KEY
    with pytest.raises(ValueError):
        encode_key(b"x" * 31)


@pytest.mark.parametrize(
    "text",
    ["", "AAAA", KEY_TEXT[:-1], KEY_TEXT + "AAAA", KEY_TEXT.replace("A", "+"), KEY_TEXT + "==="],
)
def test_bad_keys(text: str) -> None:
    with pytest.raises(SdpError):
        decode_key(text)


# ---------------------------------------------------------------- answers


def test_answer_to_our_offer() -> None:
    offer = build_offer("alice", 1, 1, "127.0.0.2", 40000, KEY)
    answer = build_answer(offer, "broker", 99, 1, "127.0.0.1", 50000)
    assert answer == sdp(
        "v=0",
        "o=broker 99 1 IN IP4 127.0.0.1",
        "s=mdeci",
        "c=IN IP4 127.0.0.1",
        "t=0 0",
        "m=application 50000 UDP/MDECI-RUDP mdeci",
        "a=mdeci-version:2",
        "a=sendrecv",
    )
    media = parse_session(answer)
    assert (media.addr, media.port, media.key, media.version) == ("127.0.0.1", 50000, None, 1)


def test_answer_to_pjsua_offer_keeps_inactive_audio() -> None:
    offer = parse_session(PJSUA_OFFER, require_key=True)
    assert offer == MdeciMedia(
        addr="127.0.0.2",
        port=40000,
        key=KEY,
        msisdn="+5521987654321",
        version=3917495064,
        sess_id="3917495063",
        user="-",
        index=1,
    )
    answer = build_answer(PJSUA_OFFER, "broker", 5, 1, "::1", 50000, msisdn="+15551234567")
    assert mlines(answer) == [
        "m=audio 9 RTP/AVP 0",
        "m=application 50000 UDP/MDECI-RUDP mdeci",
    ]
    parsed = sdp_transform.parse(answer)
    assert parsed["media"][0]["direction"] == "inactive"
    assert parsed["media"][0]["rtp"] == [{"payload": 0, "codec": "PCMU", "rate": 8000}]
    assert "mdeci-kx" not in answer
    assert parse_session(answer).msisdn == "+15551234567"
    assert parse_session(answer).ip_version == 6


def test_answer_rejects_unknown_lines_with_port_zero_in_order() -> None:
    offer = sdp(
        "v=0",
        "o=dev 1 2 IN IP6 2001:db8::1",
        "s=-",
        "c=IN IP6 2001:db8::1",
        "t=0 0",
        "m=video 5002 RTP/AVP 96",
        "a=rtpmap:96 H264/90000",
        "m=application 6000 UDP/QUIC-future mdeci",
        "m=application 0 UDP/MDECI-RUDP mdeci",
        "m=audio 0 RTP/AVP 8",
        "m=application 7000 UDP/MDECI-RUDP mdeci",
        "a=mdeci-version:2",
        f"a=mdeci-kx:{KEY_TEXT}",
        "m=application 7002 UDP/MDECI-RUDP mdeci",
        f"a=mdeci-kx:{KEY_TEXT}",
        "m=audio 4000 RTP/AVP 0 8",
        "a=inactive",
    )
    answer = build_answer(offer, "broker", 1, 1, "192.0.2.1", 9000)
    assert mlines(answer) == [
        "m=video 0 RTP/AVP 96",
        "m=application 0 UDP/QUIC-future mdeci",
        "m=application 0 UDP/MDECI-RUDP mdeci",
        "m=audio 0 RTP/AVP 8",
        "m=application 9000 UDP/MDECI-RUDP mdeci",
        "m=application 0 UDP/MDECI-RUDP mdeci",
        "m=audio 9 RTP/AVP 0",
    ]
    media = parse_session(offer)
    assert (media.addr, media.port, media.index) == ("2001:db8::1", 7000, 4)
    assert parse_session(answer).index == 4


def test_media_level_connection_wins() -> None:
    offer = sdp(
        "v=0",
        "o=- 1 1 IN IP4 192.0.2.1",
        "s=-",
        "c=IN IP4 192.0.2.1",
        "t=0 0",
        "m=application 7000 UDP/MDECI-RUDP mdeci",
        "c=IN IP6 ::2",
        f"a=mdeci-kx:{KEY_TEXT}",
    )
    media = parse_session(offer)
    assert (media.addr, media.ip_version, media.msisdn, media.mdeci_version) == ("::2", 6, None, 2)


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (["m=audio 4000 RTP/AVP 0", "a=inactive"], "audio only"),
        (["m=application 0 UDP/MDECI-RUDP mdeci"], "disabled"),
        (["m=application 7000 UDP/MDECI-RUDP other"], "wrong format"),
        (["m=application 7000 TCP/MDECI-RUDP mdeci"], "wrong proto"),
        (["m=application 7000 UDP/MDECI-RUDP mdeci", "a=mdeci-version:3"], "future version"),
        (["m=application 7000 UDP/MDECI-RUDP mdeci", "a=mdeci-version:1"], "key in clear"),
        (["m=application 7000 UDP/MDECI-RUDP mdeci", "a=sendonly"], "one way"),
        ([], "no media"),
    ],
)
def test_offers_without_usable_line_are_488(lines: list[str], why: str) -> None:
    offer = sdp("v=0", "o=- 1 1 IN IP4 192.0.2.1", "s=-", "c=IN IP4 192.0.2.1", "t=0 0", *lines)
    with pytest.raises(SdpError) as info:
        build_answer(offer, "broker", 1, 1, "192.0.2.2", 9000)
    assert info.value.status == 488, why
    with pytest.raises(SdpError):
        parse_session(offer)


@pytest.mark.parametrize(
    "extra",
    [
        [],  # no key: an offer must carry one
        [f"a=mdeci-kx:{KEY_TEXT}", f"a=mdeci-kx:{KEY_TEXT}"],
        ["a=mdeci-kx:not-a-key"],
        [f"a=mdeci-kx:{KEY_TEXT}", "a=mdeci-msisdn:12345"],
        [f"a=mdeci-kx:{KEY_TEXT}", "a=mdeci-msisdn:+1555", "a=mdeci-msisdn:+1556"],
    ],
)
def test_offer_with_bad_mdeci_attributes_is_488(extra: list[str]) -> None:
    offer = sdp(
        "v=0",
        "o=- 1 1 IN IP4 192.0.2.1",
        "s=-",
        "c=IN IP4 192.0.2.1",
        "t=0 0",
        "m=application 7000 UDP/MDECI-RUDP mdeci",
        *extra,
    )
    with pytest.raises(SdpError) as info:
        build_answer(offer, "broker", 1, 1, "192.0.2.2", 9000)
    assert info.value.status == 488


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "v=1\r\n",
        sdp("v=0", "s=-", "c=IN IP4 1.2.3.4", "m=application 7000 UDP/MDECI-RUDP mdeci"),
        sdp("v=0", "o=- x 1 IN IP4 1.2.3.4", "s=-", "m=application 7000 UDP/MDECI-RUDP mdeci"),
        sdp(
            "v=0",
            "o=- 1 1 IN IP4 1.2.3.4",
            "o=- 1 1 IN IP4 1.2.3.4",
            "c=IN IP4 1.2.3.4",
            "m=application 7000 UDP/MDECI-RUDP mdeci",
        ),
        sdp("v=0", "o=- 1 1 IN IP4 1.2.3.4", "m=application 7000 UDP/MDECI-RUDP mdeci"),
        sdp(
            "v=0",
            "o=- 1 1 IN IP4 1.2.3.4",
            "c=IN IP4 host.example",
            "m=application 7000 UDP/MDECI-RUDP mdeci",
        ),
        sdp(
            "v=0",
            "o=- 1 1 IN IP4 1.2.3.4",
            "c=IN IP6 1.2.3.4",
            "m=application 7000 UDP/MDECI-RUDP mdeci",
        ),
        sdp("v=0", "o=- 1 1 IN IP4 1.2.3.4", "c=IN IP4 1.2.3.4", "m=application 99999 UDP/X y"),
        sdp("v=0", "o=- 1 1 IN IP4 1.2.3.4", "c=IN IP4 1.2.3.4", "m=application 7000"),
        sdp("v=0", "o=- 1 1 IN IP4 1.2.3.4", "c=IN IP4 1.2.3.4", "m=application 7000 UDP/X"),
    ],
)
def test_garbage_is_a_typed_error(text: str) -> None:
    with pytest.raises(SdpError):
        parse_session(text)
    with pytest.raises(SdpError):
        build_answer(text, "b", 1, 1, "127.0.0.1", 9000)


def test_bytes_input_and_size_limits() -> None:
    offer = build_offer("alice", 1, 1, "127.0.0.2", 40000, KEY)
    assert parse_session(offer.encode()).key == KEY
    with pytest.raises(SdpError):
        parse_session(b"v=0\r\n\xff\xfe")
    with pytest.raises(SdpError):
        parse_session(offer + "a=x\r\n" * 20000)
    with pytest.raises(SdpError):
        parse_session(123)  # type: ignore[arg-type]


def test_sdp_transform_misreads_our_proto_so_we_reread_it() -> None:
    # Why sip/sdp.py re-reads m= lines: sdp_transform stops at the '-'.
    parsed = sdp_transform.parse(build_offer("a", 1, 1, "127.0.0.1", 5000, KEY))
    assert parsed["media"][0]["protocol"] != MDECI_PROTO


def test_reinvite_offer_version_grows() -> None:
    first = parse_session(build_offer("alice", 5, 1, "127.0.0.2", 40000, KEY))
    moved = parse_session(build_offer("alice", 5, 2, "127.0.0.3", 40001, KEY))
    assert (moved.version, moved.addr, moved.sess_id) == (first.version + 1, "127.0.0.3", "5")


# ---------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None)
@given(
    addr=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(str),
    port=st.integers(1, 65535),
    key=st.binary(min_size=32, max_size=32),
    version=st.integers(0, 2**40),
    sess_id=st.integers(0, 2**62),
    msisdn=st.none() | st.from_regex(r"\+[1-9][0-9]{1,14}", fullmatch=True),
    audio=st.none() | st.integers(0, 65535),
)
def test_offer_answer_round_trip(
    addr: str,
    port: int,
    key: bytes,
    version: int,
    sess_id: int,
    msisdn: str | None,
    audio: int | None,
) -> None:
    offer = build_offer("dev", sess_id, version, addr, port, key, msisdn, audio)
    got = parse_session(offer, require_key=True)
    assert (got.addr, got.port, got.key, got.msisdn, got.version) == (
        addr,
        port,
        key,
        msisdn,
        version,
    )
    assert got.sess_id == str(sess_id)
    answer = build_answer(offer, "broker", 1, version, addr, port)
    assert len(mlines(answer)) == len(mlines(offer))
    back = parse_session(answer)
    assert (back.addr, back.port, back.key, back.index) == (addr, port, None, got.index)


_SDP_PIECES = st.sampled_from(
    [
        "v=0\r\n",
        "o=- 1 1 IN IP4 1.2.3.4\r\n",
        "c=IN IP4 1.2.3.4\r\n",
        "c=IN IP6 ::1\r\n",
        "m=application 7000 UDP/MDECI-RUDP mdeci\r\n",
        "m=audio 4000 RTP/AVP 0\r\n",
        f"a=mdeci-kx:{KEY_TEXT}\r\n",
        "a=mdeci-msisdn:+1555\r\n",
        "a=mdeci-version:2\r\n",
        "a=rtpmap:0 PCMU/8000\r\n",
        "a=rtpmap:x\r\n",
        "a=sendonly\r\n",
        "a=inactive\r\n",
        "t=0 0\r\n",
        "m=",
        "a=",
        "\n",
        " ",
        "0",
        "=",
        "\u2028",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(_SDP_PIECES, max_size=14).map("".join)))
def test_any_text_parses_or_raises_sdp_error(text: str) -> None:
    with contextlib.suppress(SdpError):
        parse_session(text)
    try:
        answer = build_answer(text, "broker", 1, 1, "127.0.0.1", 9000)
    except SdpError:
        return
    assert parse_session(answer).port == 9000


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except SdpError as exc:
        return ("SdpError", exc.reason)


@settings(max_examples=300, deadline=None)
@given(st.lists(_SDP_PIECES, max_size=14).map("".join))
def test_a_description_read_once_answers_as_its_text_does(text: str) -> None:
    """The broker reads an offer once and answers from what it read."""
    read = _outcome(lambda: read_description(text))
    if not isinstance(read, SessionDescription):
        assert read == _outcome(lambda: parse_session(text))
        assert read == _outcome(lambda: build_answer(text, "broker", 1, 1, "127.0.0.1", 9000))
        return
    assert _outcome(lambda: parse_session(read, require_key=True)) == _outcome(
        lambda: parse_session(text, require_key=True)
    )
    answer = _outcome(lambda: build_answer(read, "broker", 1, 1, "127.0.0.1", 9000, key=KEY))
    assert answer == _outcome(
        lambda: build_answer(text, "broker", 1, 1, "127.0.0.1", 9000, key=KEY)
    )
    # Answering leaves the description as it was read, for a second use.
    assert read == read_description(text)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(min_size=32, max_size=32),
    st.sampled_from([("rudp",), ("quic",), ("rudp", "quic"), ("quic", "rudp")]),
    st.booleans(),
)
def test_a_stored_offers_key_is_the_one_its_full_reading_finds(
    key: bytes, transports: tuple[str, ...], audio: bool
) -> None:
    """A restarted broker reads each stored offer's ``a=mdeci-kx`` without parsing the
    rest: the same value as the full reading, one mdeci line per transport or not."""
    offer = build_offer(
        "alice", 1, 1, "192.0.2.1", 7000, key, audio_placeholder_port=8000 if audio else None,
        transports=transports, quic_port=7001,
    )  # fmt: skip
    for transport in transports:
        assert stored_key(offer, transport) == parse_session(offer, transports=(transport,)).key


def test_a_stored_offer_with_different_keys_is_read_whole() -> None:
    other = encode_key(bytes(32))
    offer = sdp(
        "v=0", "o=- 1 1 IN IP4 192.0.2.1", "s=-", "c=IN IP4 192.0.2.1", "t=0 0",
        "m=application 7000 UDP/MDECI-RUDP mdeci", f"a=mdeci-kx:{KEY_TEXT}",
        "m=application 7001 UDP/MDECI-QUIC mdeci", f"a=mdeci-kx:{other}",
    )  # fmt: skip
    assert stored_key(offer, "rudp") == KEY
    with pytest.raises(SdpError):
        stored_key("not sdp", "rudp")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(_SDP_PIECES, max_size=14).map("".join)))
def test_any_stored_text_gives_a_key_none_or_sdp_error(text: str) -> None:
    with contextlib.suppress(SdpError):
        found = stored_key(text)
        assert found is None or len(found) == 32


def test_a_session_key_in_clear_is_refused() -> None:
    """An offer with the RUDP key itself in SDP (version 1's ``a=mdeci-key``) is refused."""
    offer = sdp(
        "v=0",
        "o=- 1 1 IN IP4 192.0.2.1",
        "s=-",
        "c=IN IP4 192.0.2.1",
        "t=0 0",
        "m=application 7000 UDP/MDECI-RUDP mdeci",
        f"a=mdeci-key:{KEY_TEXT}",
    )
    with pytest.raises(SdpError, match="mdeci-key"):
        parse_session(offer, require_key=True)
