"""What a client does after it moves, until the server has surely taken its new address
(sans-IO: sizes and a clock in, "PING now" out).

The server keeps sending to the old address until a packet from the new one arrives,
then may send only three times what it received there until the path is validated
(RFC 9000 §8 and §9.3): one PING of ~30 bytes buys a PATH_CHALLENGE or two. If the
challenge or its response is lost and the client has nothing else to send, the server
gives the path up after three PTOs and goes back to the old address, and the client hears
nothing until its next keepalive (seconds). So for ``window`` seconds after a move the
client sends a PING whenever the server has been silent for ``interval``: each one is a
new packet from the new address (budget for another challenge, or the path promoted
again). It stops early once the server has sent more than three times what the client
sent since the move, which only a server that validated the new address can.
"""

from __future__ import annotations

#: Anti-amplification factor of an unvalidated path (RFC 9000 §8).
AMPLIFICATION = 3


class MigrationWatch:
    __slots__ = ("_quiet_since", "_received", "_sent", "_until", "interval", "window")

    def __init__(self, interval: float, window: float) -> None:
        self.interval = interval
        self.window = window
        self._until: float | None = None
        self._quiet_since = 0.0
        self._sent = 0
        self._received = 0

    @property
    def active(self) -> bool:
        return self._until is not None

    def start(self, now: float) -> None:
        """The client moved (its PING from the new address goes now)."""
        self._until = now + self.window
        self._quiet_since = now
        self._sent = self._received = 0

    def sent(self, size: int) -> None:
        if self._until is not None:
            self._sent += size

    def heard(self, size: int, now: float) -> None:
        if self._until is None:
            return
        self._received += size
        self._quiet_since = now
        if self._received > AMPLIFICATION * self._sent:
            self._until = None  # only a validated path carries that much

    @property
    def due(self) -> float | None:
        if self._until is None:
            return None
        return min(self._quiet_since + self.interval, self._until)

    def fire(self, now: float) -> bool:
        """Whether to PING now."""
        if self._until is None:
            return False
        if now >= self._until:
            self._until = None
            return False
        if now < self._quiet_since + self.interval:
            return False
        self._quiet_since = now  # the next one after another quiet interval
        return True
