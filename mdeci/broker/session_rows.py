"""The one writer of the stored sessions: the Session Manager's store commands, on the
database thread.

:class:`~mdeci.broker.sessions.SessionManager` decides; this runs its
:class:`~mdeci.broker.sessions.StoreSession` and :class:`~mdeci.broker.sessions.SetStatus`
commands through the service's :class:`~mdeci.broker.worker.DbWorker`, in the order they
were given (a row before its status, a status before the churn event posted after it).
Writes queued one after another, with no other call between them, share one transaction
(:meth:`~mdeci.broker.worker.DbWorker.post_batch`): a burst (a restart's peers given up,
a storm's re-INVITEs) costs one commit. A batch that fails is logged as
``database_error`` and wrote nothing; each session's next change writes it again.

It also keeps the epoch this broker holds each user at (mdeci/store/ownership.py), as the
store answered its last claim: on the database thread, so that every later store call
for the user, whatever thread asked for it, names the epoch of the writes before it. A
new session claims the user (the epoch rises); a refresh, a status and the queue calls of
:class:`~mdeci.broker.glue.Broker` are written only while the user is still held at it.
A refusal (:class:`~mdeci.store.ownership.Lost`) goes to :attr:`SessionRows.on_lost`
once; the stale epoch is kept, so that every later call for the user is refused as well
(not let through unfenced) until a new session claims the user. A claim that replaces
the row of another broker node goes to :attr:`SessionRows.on_handoff` (the churn log's
``handoff``: a user moved between brokers, by a failover or a drain).
"""

from __future__ import annotations

from collections.abc import Callable

from mdeci.broker.sessions import SetStatus, Status, StoreSession
from mdeci.broker.worker import DbWorker
from mdeci.store.ownership import Lost
from mdeci.store.repo import BrokerStore
from mdeci.store.sessions import SessionRecord, SessionStatus, SessionWrites

_STORED = {
    Status.CONNECTED: SessionStatus.CONNECTED,
    Status.DISCONNECTED: SessionStatus.DISCONNECTED,
    Status.NONE: SessionStatus.ENDED,
}


def _ignore(lost: Lost) -> None:
    del lost


def _ignore_handoff(uri: str, prev_node: str) -> None:
    del uri, prev_node


class SessionRows:
    """Writes session rows and statuses of ``store`` on ``worker``'s thread; ``clock``
    stamps a status change (wall-clock seconds)."""

    def __init__(self, store: BrokerStore, worker: DbWorker, clock: Callable[[], float]) -> None:
        self._store = store
        self._worker = worker
        self._clock = clock
        #: The epoch this broker holds (or last held, see refused) each user at (the
        #: database thread's, see above).
        self.held_epochs: dict[str, int] = {}
        # Users lost since their last claim: a refresh still queued for one writes nothing.
        self._gone: set[str] = set()
        #: Told, on the database thread, of each user this broker found it lost.
        self.on_lost: Callable[[Lost], None] = _ignore
        #: Told, on the database thread, of each user a new session took over from
        #: another node: (uri, that node).
        self.on_handoff: Callable[[str, str], None] = _ignore_handoff

    def write(self, command: StoreSession | SetStatus) -> None:
        """Queue ``command``'s write behind every call made so far (with the writes
        queued just before it, if nothing came between: one transaction)."""
        self._worker.post_batch("session writes", self._write_all, (command, self._clock()))

    def refused(self, lost: Lost) -> None:
        """A store call for ``lost.uri`` found another epoch (on the database thread).
        The epoch stays in :attr:`held_epochs`, so every later call for the user is
        refused too, until a new session claims the user again."""
        if lost.uri in self.held_epochs and lost.uri not in self._gone:
            self._gone.add(lost.uri)
            self.on_lost(lost)

    def holds(self, uri: str) -> bool:
        """This broker holds ``uri`` as far as its last store call knows."""
        return uri in self.held_epochs and uri not in self._gone

    def read_back(self) -> list[tuple[SessionRecord, int]]:
        """At start: the sessions stored CONNECTED that this broker node (or no node)
        holds, with their epochs, which this broker holds each user at from now on."""
        rows = self._store.sessions.owned_sessions(SessionStatus.CONNECTED, self._store.node)
        for record, epoch in rows:
            self.held_epochs[record.uri] = epoch
        return rows

    def _write_all(self, writes: list[tuple[StoreSession | SetStatus, float]]) -> None:
        """The writes in one transaction. Their effects on the epochs held are undone if
        it fails (it wrote none of them; each session's next change writes it again),
        and refusals and handoffs are told only once it committed."""
        undo: dict[str, tuple[int | None, bool]] = {}
        lost: list[Lost] = []
        handoffs: list[tuple[str, str]] = []
        try:
            with self._store.sessions.batch() as batch:
                for command, now in writes:
                    uri = command.uri
                    if uri not in undo:
                        undo[uri] = (self.held_epochs.get(uri), uri in self._gone)
                    if isinstance(command, SetStatus):
                        self._status(batch, lost, uri, _STORED[command.status], now)
                    elif not (command.refresh and uri in self._gone):
                        self._row(batch, lost, handoffs, command)
                    # else a refresh of a session already lost: the new holder's row stays
        except BaseException:
            for uri, (epoch, gone) in undo.items():
                if epoch is None:
                    self.held_epochs.pop(uri, None)
                else:
                    self.held_epochs[uri] = epoch
                if gone:
                    self._gone.add(uri)
                else:
                    self._gone.discard(uri)
            raise
        for one in lost:
            self.refused(one)
        for uri, node in handoffs:
            self.on_handoff(uri, node)

    def _row(
        self,
        batch: SessionWrites,
        lost: list[Lost],
        handoffs: list[tuple[str, str]],
        c: StoreSession,
    ) -> None:
        uri = c.uri
        record = SessionRecord(
            uri=uri,
            call_id=c.call_id,
            local_tag=c.local_tag,
            remote_tag=c.remote_tag,
            remote_target=c.remote_target,
            route_set=c.route_set,
            remote_sdp=c.remote_sdp,
            media_addr=c.media_addr,
            session_key=c.session_key,
            msisdn=c.msisdn,
            status=SessionStatus.CONNECTED,
            local_cseq=c.local_cseq,
            remote_cseq=c.remote_cseq,
            started_at=c.started_at,
            updated_at=c.updated_at,
            transport=c.transport,
        )
        # A refresh whose claim never reached the store (it failed) claims the user.
        got = batch.upsert(
            record, self._store.node, self.held_epochs.get(uri) if c.refresh else None
        )
        if isinstance(got, Lost):
            lost.append(got)
        else:
            self.held_epochs[uri] = got.epoch
            self._gone.discard(uri)
            if got.prev_owner and got.prev_owner != self._store.node:
                handoffs.append((uri, got.prev_owner))

    def _status(
        self, batch: SessionWrites, lost: list[Lost], uri: str, status: SessionStatus, now: float
    ) -> None:
        epoch = self.held_epochs.get(uri)
        got = batch.set_status(uri, status, now, epoch)
        if epoch is None:
            return  # a session made without SIP: unfenced
        if isinstance(got, Lost):
            lost.append(got)
        elif status is SessionStatus.ENDED:
            # Ended here while held: nothing more is written for the user until a new
            # session claims them, so the entry goes (one per user ever seen would grow).
            del self.held_epochs[uri]
