"""Which of an adapter's waiters a connection's events complete (sans-IO: the handles are
opaque to it, e.g. asyncio futures).

A handle waits for one message, for every message of a batch, or (a drain) for every
message up to an id. Message ids only grow and are acknowledged in order (a connection's
``MessageAcked`` names a run of them, oldest first), so a send or a batch is complete
once its last id is acknowledged, and sends and drains complete oldest first: each is
one entry in id order, and an acknowledgement costs what it completes, not one step per
message. A failure fails the send holding the failed message and every drain still
waiting, since each covers the failed message (those below it were completed by the
acks before it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

H = TypeVar("H")


class Waiters(Generic[H]):
    """The handles waiting on one connection's messages."""

    __slots__ = ("_drains", "_sends")

    def __init__(self) -> None:
        # (first id, last id, handle) of each send or batch, in id order; built by the
        # first send and dropped once empty (an idle peer holds no queue).
        self._sends: deque[tuple[int, int, H]] | None = None
        self._drains: deque[tuple[int, H]] | None = None  # built by the first drain

    def __len__(self) -> int:
        return len(self._sends or ()) + len(self._drains or ())

    def add(self, message_id: int, handle: H) -> None:
        """``handle`` completes when message ``message_id`` is acknowledged (ids above
        every one added before)."""
        if self._sends is None:
            self._sends = deque()
        self._sends.append((message_id, message_id, handle))

    def add_batch(self, message_ids: list[int], handle: H) -> None:
        """``handle`` completes when every one of ``message_ids`` (in increasing order,
        above every id added before) is acknowledged."""
        if self._sends is None:
            self._sends = deque()
        self._sends.append((message_ids[0], message_ids[-1], handle))

    def add_drain(self, last_id: int, handle: H) -> None:
        """``handle`` completes when every message up to ``last_id`` is acknowledged."""
        if self._drains is None:
            self._drains = deque()
        self._drains.append((last_id, handle))

    def acked(self, upto: int) -> Sequence[H]:
        """The handles the acknowledgement of every message up to ``upto`` completes."""
        sends, drains = self._sends, self._drains
        if not (sends and sends[0][1] <= upto) and not (drains and drains[0][0] <= upto):
            return ()  # e.g. a bulk writer's acks: nothing to complete
        done: list[H] = []
        while sends and sends[0][1] <= upto:
            done.append(sends.popleft()[2])
        if sends is not None and not sends:
            self._sends = None
        while drains and drains[0][0] <= upto:
            done.append(drains.popleft()[1])
        return done

    def failed(self, message_id: int) -> list[H]:
        """The handles message ``message_id``'s failure fails (each once: the rest of a
        batch whose message failed waits on nothing any more)."""
        done: list[H] = []
        sends = self._sends
        if sends:
            for i, (first, last, handle) in enumerate(sends):
                if last >= message_id:
                    if first <= message_id:
                        del sends[i]
                        done.append(handle)
                    break
            if not sends:
                self._sends = None
        done += [handle for _, handle in self._drains or ()]
        self._drains = None
        return done

    def close(self) -> list[H]:
        """Every handle still waiting, each once; nothing waits afterwards."""
        done = [handle for _, _, handle in self._sends or ()]
        done += [handle for _, handle in self._drains or ()]
        self._sends = None
        self._drains = None
        return done
