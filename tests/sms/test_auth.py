"""Authenticated SMS links: forged, tampered and replayed SMS change nothing (sans-IO)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.sms import SmsConfig, sms_tariff
from mdeci.sms.auth import (
    OVERHEAD,
    KeyRing,
    Kind,
    MemoryCounters,
    PeerCounters,
    Role,
    SmsAuth,
    SmsKeys,
    derive_keys,
    open_sealed,
    seal,
)
from mdeci.sms.codec import AckEntry, Sms, encode_acks, parse_segment, segments_needed
from mdeci.sms.counterfile import COUNTER_FILE, JsonCounters, dump_counters, parse_counters
from mdeci.sms.errors import AuthError, CounterFileError, SmsError, UnknownPeer
from mdeci.sms.link import (
    BufferAcknowledged,
    FrameReceived,
    LinkEvent,
    Refusal,
    SmsLink,
    SmsRefused,
)
from mdeci.store.users import ha1
from rudp.keys import psk_from_ha1

BROKER = "+4910"
ALICE = "+4911"
BOB = "+4912"
ALICE_HA1 = ha1("SHA-256", "alice", "mdeci", "alice-pw")
BOB_HA1 = ha1("SHA-256", "bob", "mdeci", "bob-pw")
CFG = SmsConfig(authenticated=True)
HOUR = 3600.0
EPOCH = 1_795_000_000  # 2026-11-17


def wall() -> float:
    """A wall clock that stands still: counters then count from ``EPOCH << 16``."""
    return float(EPOCH)


def broker_link(counters: MemoryCounters) -> SmsLink:
    users = {ALICE: derive_keys(ALICE_HA1, Role.BROKER), BOB: derive_keys(BOB_HA1, Role.BROKER)}
    return SmsLink(BROKER, CFG, auth=SmsAuth(users.get, counters, clock=wall))


def device_link(number: str, ha1_hex: str, counters: MemoryCounters) -> SmsLink:
    keys: dict[str, SmsKeys] = {BROKER: derive_keys(ha1_hex, Role.DEVICE)}
    return SmsLink(number, CFG, auth=SmsAuth(keys.get, counters, clock=wall))


def events(link: SmsLink) -> list[LinkEvent]:
    out = []
    while (event := link.next_event()) is not None:
        out.append(event)
    return out


def refusals(link: SmsLink) -> list[SmsRefused]:
    out = []
    while (refused := link.next_refusal()) is not None:
        out.append(refused)
    return out


def deliver(sms: list[Sms], to: SmsLink, now: float) -> list[Sms]:
    """Feed ``sms`` to ``to``; returns what it sends back."""
    for one in sms:
        to.receive_sms(one, now)
    return to.sms_to_send()


def exchange(a: SmsLink, b: SmsLink, now: float) -> None:
    """Pass SMS between two links until both are quiet."""
    out = a.sms_to_send()
    for _ in range(10):
        back = deliver(out, b, now)
        out = deliver(back, a, now)
        if not out and not back:
            return
    raise AssertionError("links never went quiet")


def test_both_ends_derive_matching_keys_per_direction_apart_from_the_rudp_psk() -> None:
    broker, device = derive_keys(ALICE_HA1, Role.BROKER), derive_keys(ALICE_HA1, Role.DEVICE)
    assert broker.send == device.receive and broker.receive == device.send
    assert broker.send != broker.receive and broker.key_id == device.key_id
    psk = psk_from_ha1(ALICE_HA1)
    assert psk not in (broker.send, broker.receive)
    assert derive_keys(BOB_HA1, Role.BROKER).send != broker.send
    assert ALICE_HA1 not in repr(broker) and broker.send.hex() not in repr(broker)


def test_keys_need_a_sha256_ha1() -> None:
    for bad in ("zz" * 32, "ab" * 16, ""):
        try:
            derive_keys(bad, Role.DEVICE)
        except AuthError:
            continue
        raise AssertionError(f"{bad!r} accepted")


def test_round_trip_in_both_directions_single_and_concatenated() -> None:
    bc, ac = MemoryCounters(), MemoryCounters()
    broker, alice = broker_link(bc), device_link(ALICE, ALICE_HA1, ac)
    for size in (10, 400):
        down = bytes(range(256)) * 2
        sent = broker.send_frame(ALICE, down[:size], 0.0)
        exchange(broker, alice, 1.0)
        assert [e for e in events(alice) if isinstance(e, FrameReceived)] == [
            FrameReceived(BROKER, down[:size])
        ]
        acked = events(broker)
        assert [e.buffer_id for e in acked if isinstance(e, BufferAcknowledged)] == [sent]
        up = b"pub" * size
        sent = alice.send_frame(BROKER, up[:size], 2.0)
        exchange(alice, broker, 3.0)
        assert events(broker) == [FrameReceived(ALICE, up[:size])]
        assert [e.buffer_id for e in events(alice) if isinstance(e, BufferAcknowledged)] == [sent]
    assert refusals(broker) == [] and refusals(alice) == []
    assert broker.pending() == [] and alice.pending() == []


def test_frames_travel_encrypted() -> None:
    broker = broker_link(MemoryCounters())
    secret = b"the payload nobody on the path may read"
    broker.send_frame(ALICE, secret, 0.0)
    (sms,) = broker.sms_to_send()
    assert b"payload" not in sms.body
    assert len(sms.body) == len(secret) + OVERHEAD


def test_a_forged_frame_from_the_victims_number_is_refused_and_changes_nothing() -> None:
    broker = broker_link(MemoryCounters())
    # The attacker knows Alice's number and the format, not her password.
    wrong = ha1("SHA-256", "alice", "mdeci", "guess")
    mallory = device_link(ALICE, wrong, MemoryCounters())
    mallory.send_frame(BROKER, b"ack everything", 0.0)
    assert deliver(mallory.sms_to_send(), broker, 1.0) == []  # not even an ack
    assert events(broker) == []
    assert refusals(broker) == [SmsRefused(ALICE, Refusal.UNAUTHENTIC, "buffer")]
    assert broker.stats.unauthentic == 1


def test_a_forged_ack_does_not_acknowledge_a_buffer() -> None:
    broker = broker_link(MemoryCounters())
    buffer_id = broker.send_frame(ALICE, b"urgent", 0.0)
    (sms,) = broker.sms_to_send()
    # The attacker reads the SMS on the path and acks its reference and tag octets,
    # sealed with keys from a guessed password.
    seg = parse_segment(sms.udh, sms.body)
    (pair,) = encode_acks(
        [AckEntry(seg.ref, seg.total, sms.body[:4])],
        dst_port=CFG.ack_port,
        src_port=CFG.data_port,
        overhead=OVERHEAD,
    )
    wrong = derive_keys(ha1("SHA-256", "alice", "mdeci", "guess"), Role.DEVICE)
    for body in (pair[1], seal(wrong.send, 1, Kind.ACK, pair[1])):
        broker.receive_sms(Sms(ALICE, BROKER, pair[0], body), 2.0)
    assert broker.pending() == [buffer_id] and events(broker) == []
    assert [r.reason for r in refusals(broker)] == [Refusal.UNAUTHENTIC] * 2
    assert broker.stats.unauthentic == 2


def test_a_tampered_frame_is_refused() -> None:
    alice = device_link(ALICE, ALICE_HA1, MemoryCounters())
    broker = broker_link(MemoryCounters())
    broker.send_frame(ALICE, b"notify nseq=7", 0.0)
    (sms,) = broker.sms_to_send()
    for i in (0, 17, len(sms.body) - 1):
        body = bytearray(sms.body)
        body[i] ^= 0x01
        alice.receive_sms(dataclasses.replace(sms, body=bytes(body)), 1.0)
    assert events(alice) == [] and alice.sms_to_send() == []
    assert [r.reason for r in refusals(alice)] == [Refusal.UNAUTHENTIC] * 3


def test_a_replayed_genuine_frame_is_refused_also_after_a_restart() -> None:
    bc, ac = MemoryCounters(), MemoryCounters()
    broker, alice = broker_link(bc), device_link(ALICE, ALICE_HA1, ac)
    alice.send_frame(BROKER, b"ack nseq=41", 0.0)
    (genuine,) = alice.sms_to_send()
    broker.receive_sms(genuine, 1.0)
    assert events(broker) == [FrameReceived(ALICE, b"ack nseq=41")]
    broker.sms_to_send()
    # Long after the duplicate memory ended: only the counter stands in the way.
    later = 1.0 + CFG.duplicate_memory + HOUR
    broker.handle_timer(later)
    broker.receive_sms(genuine, later)
    assert events(broker) == []
    assert [r.reason for r in refusals(broker)] == [Refusal.REPLAYED]
    # A restarted broker reloads the counters: the replay is still refused.
    restarted = broker_link(bc)
    restarted.receive_sms(genuine, later + 1)
    assert events(restarted) == []
    assert refusals(restarted) == [SmsRefused(ALICE, Refusal.REPLAYED, "buffer")]
    assert restarted.stats.replayed == 1


def test_a_restarted_sender_never_reuses_a_counter() -> None:
    bc, ac = MemoryCounters(), MemoryCounters()
    broker = broker_link(bc)
    alice = device_link(ALICE, ALICE_HA1, ac)
    alice.send_frame(BROKER, b"one", 0.0)
    exchange(alice, broker, 1.0)
    alice = device_link(ALICE, ALICE_HA1, ac)  # restart: counters reloaded
    alice.send_frame(BROKER, b"two", 2.0)
    exchange(alice, broker, 3.0)
    received = [e for e in events(broker) if isinstance(e, FrameReceived)]
    assert [e.frame for e in received] == [b"one", b"two"] and refusals(broker) == []
    # "one", then "two" from the same floor: acks go the other way.
    assert ac.saved[BROKER].send_next == (EPOCH << 16) + 2


def test_reordered_frames_within_the_window_are_accepted() -> None:
    broker, alice = broker_link(MemoryCounters()), device_link(ALICE, ALICE_HA1, MemoryCounters())
    for i in range(5):
        broker.send_frame(ALICE, b"n%d" % i, 0.0)
    out = broker.sms_to_send()
    deliver(out[::-1], alice, 1.0)
    assert sorted(e.frame for e in events(alice) if isinstance(e, FrameReceived)) == [
        b"n%d" % i for i in range(5)
    ]


def test_an_sms_from_a_number_on_no_record_is_refused() -> None:
    broker = broker_link(MemoryCounters())
    stranger = device_link("+4999", ALICE_HA1, MemoryCounters())
    stranger.send_frame(BROKER, b"pub", 0.0)
    assert deliver(stranger.sms_to_send(), broker, 1.0) == []
    assert refusals(broker) == [SmsRefused("+4999", Refusal.UNKNOWN_NUMBER, "buffer")]
    try:
        broker.send_frame("+4999", b"x", 2.0)
    except UnknownPeer:
        pass
    else:
        raise AssertionError("sent to a number without keys")


def test_a_new_password_starts_the_counters_over() -> None:
    bc, ac = MemoryCounters(), MemoryCounters()
    broker = broker_link(bc)
    alice = device_link(ALICE, ALICE_HA1, ac)
    for frame in (b"a", b"b", b"c"):
        alice.send_frame(BROKER, frame, 0.0)
    exchange(alice, broker, 1.0)
    new_ha1 = ha1("SHA-256", "alice", "mdeci", "new-pw")
    keys = {ALICE: derive_keys(new_ha1, Role.BROKER)}
    broker = SmsLink(BROKER, CFG, auth=SmsAuth(keys.get, bc, clock=wall))
    alice = device_link(ALICE, new_ha1, MemoryCounters())  # a new device: counter 1
    alice.send_frame(BROKER, b"d", 2.0)
    exchange(alice, broker, 3.0)
    assert [e.frame for e in events(broker) if isinstance(e, FrameReceived)] == [b"d"]


def test_auth_goes_with_the_authenticated_config_only() -> None:
    nobody: dict[str, SmsKeys] = {}
    for config, auth in (
        (CFG, None),
        (SmsConfig(), SmsAuth(nobody.get, MemoryCounters(), clock=wall)),
    ):
        try:
            SmsLink(BROKER, config, auth=auth)
        except SmsError:
            continue
        raise AssertionError("mismatched link accepted")


def test_overhead_is_counted_by_the_tariff_and_segments() -> None:
    assert OVERHEAD == 22 and CFG.overhead == 22 and SmsConfig().overhead == 4
    assert sms_tariff(0.1, CFG).overhead_bytes == 22
    assert segments_needed(106, overhead=CFG.overhead) == 1
    assert segments_needed(107, overhead=CFG.overhead) == 2


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(list(Kind)))
def test_opening_arbitrary_bytes_is_an_auth_error_never_a_crash(data: bytes, kind: Kind) -> None:
    key = derive_keys(ALICE_HA1, Role.DEVICE).receive
    try:
        open_sealed(key, kind, data)
    except AuthError:
        return
    raise AssertionError("arbitrary bytes authenticated")


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=140), st.integers(1, 2**48 - 1))
def test_seal_open_round_trip_and_kinds_do_not_mix(plain: bytes, counter: int) -> None:
    key = derive_keys(ALICE_HA1, Role.DEVICE).send
    sealed = seal(key, counter, Kind.DATA, plain)
    assert open_sealed(key, Kind.DATA, sealed) == (counter, plain)
    try:
        open_sealed(key, Kind.ACK, sealed)
    except AuthError:
        return
    raise AssertionError("a buffer passed for an ack")


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([ALICE, BOB, "+4999"]),
    st.binary(max_size=16),
    st.binary(max_size=127),
)
def test_arbitrary_sms_to_an_authenticated_link_deliver_nothing(
    sender: str, udh: bytes, body: bytes
) -> None:
    broker = broker_link(MemoryCounters())
    broker.receive_sms(Sms(sender, BROKER, udh, body[: 140 - len(udh)]), 0.0)
    data_udh = b"\x0b\x00\x03\x01\x01\x01\x05\x04\x3f\xac\x3f\xac"
    broker.receive_sms(Sms(sender, BROKER, data_udh, body[:128]), 0.0)
    broker.receive_sms(Sms(sender, BROKER, b"\x06\x05\x04\x3f\xad\x3f\xac", body[:133]), 0.0)
    assert not [e for e in events(broker) if isinstance(e, FrameReceived)]
    assert broker.pending() == []


def test_a_sender_that_lost_its_counters_starts_above_every_counter_it_used() -> None:
    receiver = broker_link(MemoryCounters())
    keys = {BROKER: derive_keys(ALICE_HA1, Role.DEVICE)}
    clock = [float(EPOCH)]
    alice = SmsLink(ALICE, CFG, auth=SmsAuth(keys.get, MemoryCounters(), clock=lambda: clock[0]))
    for i in range(3):
        alice.send_frame(BROKER, b"before %d" % i, 0.0)
    first = alice.sms_to_send()
    deliver(first, receiver, 1.0)
    # The device's files are gone (a new phone, a restored backup); a second later:
    clock[0] += 1.0
    alice = SmsLink(ALICE, CFG, auth=SmsAuth(keys.get, MemoryCounters(), clock=lambda: clock[0]))
    alice.send_frame(BROKER, b"after", 2.0)
    (after,) = alice.sms_to_send()
    counters = {open_sealed(keys[BROKER].send, Kind.DATA, s.body)[0] for s in first}
    assert open_sealed(keys[BROKER].send, Kind.DATA, after.body)[0] > max(counters)
    deliver([after], receiver, 3.0)
    received = [e.frame for e in events(receiver) if isinstance(e, FrameReceived)]
    assert received == [b"before 0", b"before 1", b"before 2", b"after"]


def test_a_key_ring_keys_numbers_from_ha1_and_forgets_them() -> None:
    ring = KeyRing(Role.BROKER)
    ring.set(ALICE, ALICE_HA1)
    assert ring.get(ALICE) == derive_keys(ALICE_HA1, Role.BROKER) and ring.numbers() == [ALICE]
    ring.set(ALICE, None)
    assert ring.get(ALICE) is None and ring.numbers() == []


class FailingCounters(MemoryCounters):
    """A counter store whose disk is full while ``full`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.full = False

    def save(self, peer: str, counters: PeerCounters) -> None:
        if self.full:
            raise CounterFileError("disk full")
        super().save(peer, counters)


def test_a_frame_whose_counter_cannot_be_recorded_is_neither_taken_nor_acked() -> None:
    store = FailingCounters()
    broker = broker_link(store)
    alice = device_link(ALICE, ALICE_HA1, MemoryCounters())
    alice.send_frame(BROKER, b"pub", 0.0)
    sms = alice.sms_to_send()
    store.full = True
    assert deliver(sms, broker, 1.0) == [] and events(broker) == []
    assert [r.reason for r in refusals(broker)] == [Refusal.UNRECORDED]
    store.full = False
    alice.handle_timer(1.0 + CFG.ack_timeout)  # the resend
    exchange(alice, broker, 2.0 + CFG.ack_timeout)
    assert [e for e in events(broker) if isinstance(e, FrameReceived)] == [
        FrameReceived(ALICE, b"pub")
    ]
    assert alice.pending() == []


def test_the_counter_file_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / COUNTER_FILE
    counters = JsonCounters(path)
    counters.save(ALICE, PeerCounters("ab", 7, 9, (8, 9)))
    assert JsonCounters(path).load(ALICE) == PeerCounters("ab", 7, 9, (8, 9))
    assert JsonCounters(tmp_path / "none.json").load(ALICE) is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_a_malformed_counter_file_is_a_named_error(data: bytes) -> None:
    try:
        parse_counters(data)
    except CounterFileError:
        return


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=16),
        st.builds(
            PeerCounters,
            st.text(max_size=16),
            st.integers(0, 2**48),
            st.integers(0, 2**48),
            st.lists(st.integers(0, 2**48), max_size=5).map(tuple),
        ),
        max_size=5,
    )
)
def test_counter_files_round_trip(peers: dict[str, PeerCounters]) -> None:
    assert parse_counters(dump_counters(peers)) == peers
