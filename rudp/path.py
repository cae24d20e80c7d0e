"""Path validation, as QUIC's (RFC 9000 §8.2): the peer's address changes only after the
new path answered a challenge.

An authentic datagram from an address other than the peer's makes that address the
candidate: it gets a PATH_CHALLENGE with a fresh token. Only an authentic PATH_RESPONSE
carrying that token, received from that same address, makes the candidate the peer's
address. A copy of a genuine datagram with a forged source authenticates too, but whoever
forged it cannot answer from there (the token travels encrypted), so the peer stays.

While the candidate keeps sending, its challenge is repeated with the same token at most
every :data:`CHALLENGE_INTERVAL` seconds: the first challenge may be lost, and waiting for
an RTO would strand the peer behind it; a burst from the candidate costs one challenge.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from rudp import packet as wire
from rudp.events import PathChallenged, PathValidated
from rudp.fields import ConnectionFields
from rudp.packet import TOKEN_SIZE

Address = tuple[str, int]

CHALLENGE_INTERVAL = 0.05


def challenge_token(key: bytes, sender_id: int, number: int) -> bytes:
    """The token of challenge ``number`` of the connection ``sender_id`` under ``key``:
    unique per challenge and unpredictable without the key, with no random source."""
    label = b"mdeci-rudp path token" + sender_id.to_bytes(4, "big") + number.to_bytes(8, "big")
    return hmac.digest(key, label, "sha256")[:TOKEN_SIZE]


class PathCandidate:
    """The address a peer seems to speak from, until it answers or another replaces it."""

    __slots__ = ("address", "challenged_at", "due", "token")

    def __init__(self, address: Address, token: bytes) -> None:
        self.address = address
        self.token = token
        self.challenged_at: float | None = None
        self.due = True  # a challenge is to be sent

    def heard(self, now: float) -> None:
        """The candidate sent an authentic, newest datagram again: challenge it again
        unless the last challenge is younger than the interval."""
        if self.challenged_at is None or now - self.challenged_at >= CHALLENGE_INTERVAL:
            self.due = True

    def sent(self, now: float) -> None:
        self.due = False
        self.challenged_at = now

    def answered_by(self, token: bytes, source: Address) -> bool:
        """Whether a PATH_RESPONSE ``token`` received from ``source`` validates this path."""
        return source == self.address and hmac.compare_digest(token, self.token)


class PathWork:
    """A connection's path work in progress: the candidate address being validated and
    the peer's challenges to answer. The connection holds None while there is neither:
    one slot of every connection, not two."""

    __slots__ = ("candidate", "responses")

    def __init__(self) -> None:
        self.candidate: PathCandidate | None = None
        self.responses: list[bytes] | None = None  # tokens of challenges to answer


class PathValidation(ConnectionFields):
    """The connection's peer address and the validation of a candidate."""

    __slots__ = ()

    if TYPE_CHECKING:  # of the other parts of the connection

        def path_changed(self, now: float) -> None: ...

        def _packet(self, frames: list[bytes], now: float) -> bytes: ...

    @property
    def peer_address(self) -> Address | None:
        """Where :meth:`datagrams_to_send`'s datagrams go (None: the caller does not say)."""
        return self._peer_address

    def set_peer_address(self, address: Address, now: float) -> None:
        """Send to ``address`` from now on, without validation: the caller learnt it from
        a trusted channel (signalling). A new address is a path change (:meth:`path_changed`)."""
        if address != self._peer_address:
            self.path_changed(now)
        self._peer_address = address
        candidate = self._candidate
        if candidate is not None and candidate.address == address:
            self._set_candidate(None)

    @property
    def _candidate(self) -> PathCandidate | None:
        return None if self._path is None else self._path.candidate

    def _set_candidate(self, candidate: PathCandidate | None) -> None:
        path = self._path
        if path is None:
            if candidate is None:
                return
            path = self._path = PathWork()
        path.candidate = candidate
        if candidate is None and path.responses is None:
            self._path = None

    def _challenged(self, token: bytes) -> None:
        """The peer challenged our path with ``token``: answered with the next datagrams."""
        if self._path is None:
            self._path = PathWork()
        if self._path.responses is None:
            self._path.responses = []
        self._path.responses.append(token)

    def _responses_due(self) -> list[bytes] | None:
        """The tokens to answer now, taken (None: none)."""
        path = self._path
        if path is None or path.responses is None:
            return None
        tokens, path.responses = path.responses, None
        if path.candidate is None:
            self._path = None
        return tokens

    def _on_new_source(self, source: Address, now: float) -> None:
        """An authentic, newest datagram from ``source``, not the peer's address."""
        if self._peer_address is None:
            return  # no address tracked: nothing to move
        candidate = self._candidate
        if candidate is not None and candidate.address == source:
            candidate.heard(now)
            return
        self._challenges += 1
        token = challenge_token(self._key, self.sender_id, self._challenges)
        self._set_candidate(PathCandidate(source, token))
        self._emit(PathChallenged(source, self._peer_address))

    def _on_path_response(self, token: bytes, source: Address | None, now: float) -> None:
        candidate = self._candidate
        if source is None or candidate is None or not candidate.answered_by(token, source):
            self.stats.path_responses_ignored += 1
            return
        previous = self._peer_address
        self._set_candidate(None)
        self._peer_address = source
        self.path_changes += 1
        self.path_changed(now)  # what is in flight goes to the validated address at once
        self._emit(PathValidated(source, previous))

    def path_challenge_to_send(self, now: float) -> tuple[bytes, Address] | None:
        """The PATH_CHALLENGE datagram due to the candidate address, with that address,
        or None (``rudp.path`` says when one is due)."""
        path = self._path  # read once per flush: no property call on the usual None
        candidate = None if path is None else path.candidate
        if candidate is None or not candidate.due:
            return None
        candidate.sent(now)
        self.stats.path_challenges_sent += 1
        datagram = self._packet([wire.push_frame(wire.PathChallenge(candidate.token))], now)
        return datagram, candidate.address
