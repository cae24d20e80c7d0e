"""Two RUDP cores wired in memory on a hand-stepped clock, with a scripted lossy network."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from rudp import MessageAcked, MessageFailed, MessageReceived, RudpConfig, RudpConnection

KEY = bytes(range(32))

# fate(datagram index) -> list of delays; [] = lost, two entries = duplicated.
Fate = Callable[[int], list[float]]


@dataclass
class Net:
    a: RudpConnection
    b: RudpConnection
    fate: Fate
    now: float = 0.0
    received: dict[str, list[bytes]] = field(default_factory=lambda: {"a": [], "b": []})
    acked: dict[str, list[int]] = field(default_factory=lambda: {"a": [], "b": []})
    failed: dict[str, list[int]] = field(default_factory=lambda: {"a": [], "b": []})
    _queue: list[tuple[float, int, str, bytes]] = field(default_factory=list)
    _count: int = 0

    def flush(self) -> None:
        for name, conn, other in (("a", self.a, "b"), ("b", self.b, "a")):
            for datagram in conn.datagrams_to_send(self.now):
                for delay in self.fate(self._count):
                    heapq.heappush(self._queue, (self.now + delay, self._count, other, datagram))
                self._count += 1
            while (event := conn.next_event()) is not None:
                if isinstance(event, MessageReceived):
                    self.received[name].append(event.data)
                elif isinstance(event, MessageAcked):
                    self.acked[name].extend(range(event.message_id, event.last + 1))
                elif isinstance(event, MessageFailed):
                    self.failed[name].append(event.message_id)

    def step(self) -> bool:
        """Advance to the next arrival or timer; False when nothing is left to do."""
        self.flush()
        timers = [t for t in (self.a.get_timer(), self.b.get_timer()) if t is not None]
        arrival = self._queue[0][0] if self._queue else None
        candidates = timers + ([arrival] if arrival is not None else [])
        if not candidates:
            return False
        self.now = max(self.now, min(candidates))
        if arrival is not None and arrival <= self.now:
            _, _, dst, data = heapq.heappop(self._queue)
            (self.a if dst == "a" else self.b).receive_datagram(data, self.now)
        else:
            for conn in (self.a, self.b):
                timer = conn.get_timer()
                if timer is not None and timer <= self.now:
                    conn.handle_timer(self.now)
        self.flush()
        return True

    def run_until(self, done: Callable[[], bool], max_steps: int = 200_000) -> None:
        for _ in range(max_steps):
            if done():
                return
            self.step()
        raise AssertionError("simulation did not finish within max_steps")


def pair(config: RudpConfig, fate: Fate) -> Net:
    return Net(
        RudpConnection(KEY, config, sender_id=1), RudpConnection(KEY, config, sender_id=2), fate
    )
