"""Authenticated, encrypted SMS buffers and acks: per-user keys from HA1, replay counters.

Theory of operation (docs/sms.md "Authentication"). The broker and a device already share
the user's SHA-256 HA1 (the broker from its user table, the agent from its password).
:func:`derive_keys` expands it with HKDF-SHA256 under a label of its own
(``"mdeci-sms v1"``), so the SMS keys are independent of the RUDP session secret that
the same HA1 feeds (docs/security.md §3): one AES-256-GCM key per direction (broker to
device, device to broker) and a key id that names the pair without revealing it.

Every mdeci SMS buffer (a frame) and every ack SMS body is *sealed*::

    tag (16) | counter (6, big-endian) | ciphertext

with the direction's key, the nonce ``0^6 | counter`` and the associated data
``kind | counter`` (``D`` for a buffer, ``A`` for an ack body), so a buffer cannot be
passed off as an ack. The counter counts every sealed thing of one direction, so a
nonce never repeats under a key; the sender persists its next counter before the SMS
leaves. Against a counter file that is lost or restored from a backup, a sender that
(re)loads a peer starts no lower than ``wall clock seconds << 16``: a counter used before
is below that unless the sender sealed more than 65,536 bodies a second on average since
(SMS go out a few a second at most), and 48 bits of it last until 2106. The receiver
refuses a counter it accepted already, through an anti-replay window
(:class:`~mdeci.sms.dedupe.NseqGate`, since SMS reorders) whose state it persists too.
Persistence is the caller's: a :class:`CounterStore` whose ``save`` returns once
the state is durable. :class:`SmsAuth` holds no I/O; it loads a peer's counters once
and saves them on every change.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from mdeci.sms.dedupe import NseqGate
from mdeci.sms.errors import AuthError, ReplayedFrame, SmsError, UnknownPeer

SALT = b"mdeci-sms v1"
INFO = b"mdeci sms keys"
TAG_OCTETS = 16
COUNTER_OCTETS = 6
#: Octets a sealed buffer or ack body adds to what it carries.
OVERHEAD = TAG_OCTETS + COUNTER_OCTETS
MAX_COUNTER = (1 << (8 * COUNTER_OCTETS)) - 1
#: How far below the highest accepted counter an unseen one is still accepted.
DEFAULT_WINDOW = 128


class Kind(enum.Enum):
    """What a sealed body is: its first octet of associated data."""

    DATA = b"D"
    ACK = b"A"


class Role(enum.Enum):
    """Which end derives the keys: it sends with one direction's key, receives with the other."""

    BROKER = "broker"
    DEVICE = "device"


@dataclass(frozen=True, slots=True)
class SmsKeys:
    """One user's SMS keys as one end sees them; ``key_id`` names the pair (hex)."""

    send: bytes
    receive: bytes
    key_id: str

    def __repr__(self) -> str:
        return f"SmsKeys(key_id={self.key_id!r})"


def derive_keys(ha1_hex: str, role: Role) -> SmsKeys:
    """The SMS keys of the user whose SHA-256 HA1 is ``ha1_hex``, for ``role``'s end.

    Raises :class:`AuthError` unless ``ha1_hex`` is 64 hex digits.
    """
    try:
        ikm = bytes.fromhex(ha1_hex)
    except ValueError:
        raise AuthError("HA1 is not hex") from None
    if len(ikm) != 32:
        raise AuthError("SMS keys derive from a SHA-256 HA1 (32 octets)")
    okm = HKDF(algorithm=hashes.SHA256(), length=72, salt=SALT, info=INFO).derive(ikm)
    down, up, key_id = okm[:32], okm[32:64], okm[64:].hex()
    if role is Role.BROKER:
        return SmsKeys(send=down, receive=up, key_id=key_id)
    return SmsKeys(send=up, receive=down, key_id=key_id)


def _nonce(counter: int) -> bytes:
    return bytes(12 - COUNTER_OCTETS) + counter.to_bytes(COUNTER_OCTETS, "big")


def seal(key: bytes, counter: int, kind: Kind, plaintext: bytes) -> bytes:
    """``tag | counter | ciphertext`` of ``plaintext`` (module docstring)."""
    if not 1 <= counter <= MAX_COUNTER:
        raise SmsError(f"SMS counter {counter} out of range")
    ctr = counter.to_bytes(COUNTER_OCTETS, "big")
    out = AESGCM(key).encrypt(_nonce(counter), plaintext, kind.value + ctr)
    return out[-TAG_OCTETS:] + ctr + out[:-TAG_OCTETS]


def open_sealed(key: bytes, kind: Kind, sealed: bytes) -> tuple[int, bytes]:
    """(counter, plaintext) of a sealed body; raises :class:`AuthError` if it is not one."""
    if len(sealed) < OVERHEAD:
        raise AuthError(f"sealed body of {len(sealed)} < {OVERHEAD} octets")
    tag, ctr, ct = sealed[:TAG_OCTETS], sealed[TAG_OCTETS:OVERHEAD], sealed[OVERHEAD:]
    counter = int.from_bytes(ctr, "big")
    if counter == 0:
        raise AuthError("counter 0 is never sent")
    try:
        plaintext = AESGCM(key).decrypt(_nonce(counter), ct + tag, kind.value + ctr)
    except InvalidTag:
        raise AuthError("authentication failed") from None
    return counter, plaintext


@dataclass(frozen=True, slots=True)
class PeerCounters:
    """What :class:`SmsAuth` persists per peer number.

    ``send_next``: the counter the next sealed thing to the peer gets; ``recv_highest``
    and ``recv_recent``: the anti-replay window of what came from it; ``key_id``: the
    keys these counters belong to (new keys, e.g. a new password, start over).
    """

    key_id: str = ""
    send_next: int = 1
    recv_highest: int = 0
    recv_recent: tuple[int, ...] = ()


class CounterStore(Protocol):
    """Where the caller keeps :class:`PeerCounters`; ``save`` returns once it is durable."""

    def load(self, peer: str) -> PeerCounters | None: ...

    def save(self, peer: str, counters: PeerCounters) -> None: ...


class KeyRing:
    """Number to :class:`SmsKeys` for one end, filled by the caller from HA1s it holds.

    Its :meth:`get` is what :class:`SmsAuth` asks; it never blocks.
    """

    def __init__(self, role: Role) -> None:
        self.role = role
        self._keys: dict[str, SmsKeys] = {}

    def set(self, number: str, ha1_hex: str | None) -> None:
        """Key ``number`` with the user's SHA-256 HA1 (``None``: forget the number).

        Raises :class:`AuthError` for an HA1 that is not a SHA-256 one.
        """
        if ha1_hex is None:
            self._keys.pop(number, None)
        else:
            self._keys[number] = derive_keys(ha1_hex, self.role)

    def get(self, number: str) -> SmsKeys | None:
        return self._keys.get(number)

    def numbers(self) -> list[str]:
        return list(self._keys)


class MemoryCounters:
    """A :class:`CounterStore` in a dict (tests; a restart reuses the same object)."""

    def __init__(self) -> None:
        self.saved: dict[str, PeerCounters] = {}

    def load(self, peer: str) -> PeerCounters | None:
        return self.saved.get(peer)

    def save(self, peer: str, counters: PeerCounters) -> None:
        self.saved[peer] = counters


@dataclass(slots=True)
class _Peer:
    keys: SmsKeys
    send_next: int
    gate: NseqGate


class SmsAuth:
    """Seals and opens one end's SMS bodies; ``keys`` maps a number to its user's keys.

    ``keys`` returns ``None`` for a number on no user's record. It is asked on every
    use, so a user removed or re-keyed takes effect at once; it must not block.
    ``clock`` is the wall clock (epoch seconds) that floors a reloaded send counter.
    """

    def __init__(
        self,
        keys: Callable[[str], SmsKeys | None],
        counters: CounterStore,
        *,
        clock: Callable[[], float],
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self._keys = keys
        self._counters = counters
        self._clock = clock
        self._window = window
        self._peers: dict[str, _Peer] = {}

    def knows(self, peer: str) -> bool:
        """Whether ``peer`` is on a user's record (has keys)."""
        return self._keys(peer) is not None

    def seal(self, peer: str, kind: Kind, plaintext: bytes) -> bytes:
        """Seal ``plaintext`` for ``peer`` under the next counter, persisted first.

        Raises :class:`UnknownPeer` for a number without keys, and what the store's
        ``save`` raises (the counter stays used: it is never sealed twice).
        """
        state = self._peer(peer)
        counter = state.send_next
        state.send_next += 1
        self._save(peer, state)
        return seal(state.keys.send, counter, kind, plaintext)

    def open(self, peer: str, kind: Kind, sealed: bytes) -> tuple[int, bytes]:
        """(counter, plaintext) of a body from ``peer``; no replay check (:meth:`accept`).

        Raises :class:`UnknownPeer` or :class:`AuthError`.
        """
        return open_sealed(self._peer(peer).keys.receive, kind, sealed)

    def fresh(self, peer: str, counter: int) -> bool:
        """Whether ``counter`` from ``peer`` was never accepted (and is not too old)."""
        return not self._peer(peer).gate.seen(counter)

    def accept(self, peer: str, counter: int) -> None:
        """Record ``counter`` from ``peer`` as used, persisted before returning.

        Raises :class:`ReplayedFrame` if it was accepted already or is too old, and what
        the store's ``save`` raises (then the counter is not accepted either).
        """
        state = self._peer(peer)
        before = state.gate.copy()
        if not state.gate.accept(counter):
            raise ReplayedFrame(f"counter {counter} from {peer} seen already")
        try:
            self._save(peer, state)
        except Exception:
            state.gate = before
            raise

    def _peer(self, peer: str) -> _Peer:
        keys = self._keys(peer)
        if keys is None:
            self._peers.pop(peer, None)
            raise UnknownPeer(f"{peer} is on no user's record")
        state = self._peers.get(peer)
        if state is not None and state.keys == keys:
            return state
        saved = self._counters.load(peer)
        if saved is None or saved.key_id != keys.key_id:
            saved = PeerCounters(key_id=keys.key_id)
        gate = NseqGate(saved.recv_highest, window=self._window, recent=saved.recv_recent)
        floor = max(0, int(self._clock())) << 16
        state = self._peers[peer] = _Peer(keys, max(saved.send_next, floor, 1), gate)
        return state

    def _save(self, peer: str, state: _Peer) -> None:
        self._counters.save(
            peer,
            PeerCounters(
                key_id=state.keys.key_id,
                send_next=state.send_next,
                recv_highest=state.gate.highest,
                recv_recent=state.gate.recent,
            ),
        )
