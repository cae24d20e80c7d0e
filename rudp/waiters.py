"""Which of an adapter's waiters a connection's events complete (sans-IO: the handles are
opaque to it, e.g. asyncio futures).

A handle waits for one message, for every message of a batch, or (a drain) for every
message up to an id. Message ids only grow and are acknowledged in order, so drains
complete oldest first; a failure fails every drain still waiting, since each covers the
failed message (those below it were completed by the acks before it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

H = TypeVar("H")


class Waiters(Generic[H]):
    """The handles waiting on one connection's messages."""

    __slots__ = ("_batches", "_by_id", "_drains")

    def __init__(self) -> None:
        self._by_id: dict[int, H] = {}
        # id(handle) -> messages of its batch not yet acknowledged; built by the first batch
        self._batches: dict[int, int] | None = None
        self._drains: deque[tuple[int, H]] | None = None  # built by the first drain

    def __len__(self) -> int:
        return len(self._by_id) + len(self._drains or ())

    def add(self, message_id: int, handle: H) -> None:
        """``handle`` completes when message ``message_id`` is acknowledged."""
        self._by_id[message_id] = handle

    def add_batch(self, message_ids: list[int], handle: H) -> None:
        """``handle`` completes when every one of ``message_ids`` is acknowledged."""
        if self._batches is None:
            self._batches = {}
        self._batches[id(handle)] = len(message_ids)
        for message_id in message_ids:
            self._by_id[message_id] = handle

    def add_drain(self, last_id: int, handle: H) -> None:
        """``handle`` completes when every message up to ``last_id`` is acknowledged."""
        if self._drains is None:
            self._drains = deque()
        self._drains.append((last_id, handle))

    def acked(self, message_id: int) -> Sequence[H]:
        """The handles message ``message_id``'s acknowledgement completes."""
        handle = self._by_id.pop(message_id, None)
        drains = self._drains
        if handle is None and not (drains and drains[0][0] <= message_id):
            return ()  # the common case of a bulk writer: one ack, nothing to complete
        done: list[H] = []
        if handle is not None:
            batches = self._batches
            key = id(handle)
            left = None if batches is None else batches.get(key)
            if batches is None or left is None:  # a handle of its own
                done.append(handle)
            elif left > 1:
                batches[key] = left - 1
            else:
                del batches[key]
                done.append(handle)
            if not self._by_id:
                self._by_id.clear()  # an emptied dict keeps its table; clear() frees it
        while drains and drains[0][0] <= message_id:
            done.append(drains.popleft()[1])
        return done

    def failed(self, message_id: int) -> list[H]:
        """The handles message ``message_id``'s failure fails (each once: the rest of a
        batch whose message failed waits on nothing any more)."""
        done: list[H] = []
        handle = self._by_id.pop(message_id, None)
        if handle is not None:
            done.append(handle)
            if self._batches and self._batches.pop(id(handle), None) is not None:
                for other in [k for k, v in self._by_id.items() if v is handle]:
                    del self._by_id[other]
        done += [handle for _, handle in self._drains or ()]
        self._drains = None
        if not self._by_id:
            self._by_id.clear()
        return done

    def close(self) -> list[H]:
        """Every handle still waiting, each once; nothing waits afterwards."""
        done = list({id(h): h for h in self._by_id.values()}.values())
        done += [handle for _, handle in self._drains or ()]
        self._by_id.clear()
        self._batches = None
        self._drains = None
        return done
