"""The delivery's queue calls, fenced by the epochs this broker holds its users at.

:class:`~mdeci.broker.glue.Broker` carries out the core's :class:`AckMany`,
:class:`PendingMany`, :class:`CheckHeld` and :class:`TakeMissed` here, on the database
thread. For a user in :attr:`FencedQueues.fence` (the epochs of
mdeci/broker/session_rows.py) each call is fenced by its epoch: a user another broker
holds now gets nothing deleted, nothing read and nothing sent (a count of 0, no rows, a
user named lost: the core goes on as if its queue were empty), and the fence hears of
the refusals it can tell (an empty read says nothing: the next ack or status does).
Users without an epoch (a session made without SIP) and a broker without a fence use the
plain queue calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from mdeci.broker.delivery import AckMany, CheckHeld, PendingMany, TakeMissed
from mdeci.store.ownership import Lost
from mdeci.store.queue_rows import DeliveryRow
from mdeci.store.repo import BrokerStore

# Users per read of FencedQueues.check_all (SQLite binds at most 32,766 values).
CHECK_CHUNK = 1000


class Fence(Protocol):
    """The epochs this broker holds its users at (mdeci/broker/session_rows.py)."""

    @property
    def held_epochs(self) -> Mapping[str, int]: ...

    def refused(self, lost: Lost) -> None:
        """A fenced call found ``lost.uri`` held at another epoch."""

    def holds(self, uri: str) -> bool:
        """This broker holds ``uri`` (it has an epoch for it, not refused since)."""


class FencedQueues:
    """The queue calls of the core's delivery over ``store``; see the module docstring."""

    def __init__(self, store: BrokerStore) -> None:
        self._store = store
        self.fence: Fence | None = None

    def ack_many(self, command: AckMany) -> list[int]:
        fence = self.fence
        if fence is None or not fence.held_epochs:
            return self._store.queues.ack_many(command.held)
        store = self._store
        counts, lost = store.ownership.ack_many(store.queues, command.held, fence.held_epochs)
        for gone in lost:
            fence.refused(gone)
        return counts

    def pending_many(self, command: PendingMany) -> list[list[DeliveryRow]]:
        epochs = None if self.fence is None else self.fence.held_epochs
        if not epochs:
            return self._store.queues.pending_many(command.reads)
        return self._store.queues.pending_many(command.reads, epochs)

    def check_held(self, command: CheckHeld) -> frozenset[str]:
        fence = self.fence
        epochs = {} if fence is None else fence.held_epochs
        fenced = {uri: epochs[uri] for uri in command.uris if uri in epochs}
        if fence is None or not fenced:
            return frozenset()
        lost = self._store.ownership.lost_of(fenced)
        for gone in lost:
            fence.refused(gone)
        return frozenset(gone.uri for gone in lost)

    def take_missed(self, command: TakeMissed) -> int:
        epoch = None if self.fence is None else self.fence.held_epochs.get(command.uri)
        if self.fence is None or epoch is None:
            return self._store.queues.take_missed(command.uri)
        got = self._store.ownership.take_missed(command.uri, epoch)
        if isinstance(got, Lost):
            self.fence.refused(got)
            return 0
        return got

    def check_all(self) -> None:
        """Every user held here, checked against the store (one read per chunk): those
        another broker holds now are refused, as a fenced call would find. The sweep's,
        for a broker that was frozen (SIGSTOP, a stalled VM) while its users went
        elsewhere and that has nothing to send or hear for them since."""
        fence = self.fence
        if fence is None:
            return
        epochs = dict(fence.held_epochs)
        uris = sorted(epochs)
        for i in range(0, len(uris), CHECK_CHUNK):
            part = {uri: epochs[uri] for uri in uris[i : i + CHECK_CHUNK]}
            for gone in self._store.ownership.lost_of(part):
                fence.refused(gone)
