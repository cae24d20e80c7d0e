"""The asyncio service around :class:`~mdeci.broker.glue.Broker`: RUDP peers and tasks.

Glue only, as ``rudp/aio`` is for its core. One :class:`~rudp.aio.RudpEndpoint` serves
every user; per connected user there is one :class:`~rudp.aio.RudpPeer` (keyed by the
session secret agreed through SDP, docs/security.md), and tasks only while there is
work (an idle session holds no task, event or queue, for memory):

- inbound: the peer's ``on_message`` callback appends to the inbound list; one pump
  task hands what every peer delivered by then, decoded (once, to admit it), to
  ``Broker.handle_decoded`` (publishes arriving together share one commit; what arrives
  while that call runs is the next call's batch, so a busy broker commits once per
  database round trip, not once per frame) -> replies sent on the peer, in the order
  the frames came;
- one delivery task for every user: the users whose delivery may progress (the core's
  :class:`~mdeci.broker.delivery.QueueListener` calls: a publish queued something, an ack
  freed the window; a connection) are marked due, and the task hands all of them to
  ``Broker.take_batches`` in one worker call (a fan-out wakes a hundred users at once:
  one call, one transaction for their held acks, one connection for their reads) -> each
  notify queued on the RUDP peer at once, in nseq order (no task per message; one future
  per batch until the path is proved, none after); what is marked due during the call is
  the next call's: no polling;
- sends: a :class:`~rudp.aio.PeerUnreachable` (at once, or when retries run out: by a
  send's future, or by the ``DataPeer``'s ``on_gone`` once the path is proved) is the
  Session Manager's ``media_failed`` for the send's epoch.

Sessions: who is CONNECTED, since which epoch, and whether its path was proved are the
:class:`~mdeci.broker.sessions.SessionManager`'s (``self.sessions``); this service hands
it the transport's events (a datagram heard, a send failed, a send acknowledged) and
carries out its commands (:meth:`BrokerService.apply`): attach or drop a peer, open or
close the core's delivery window, tell the SMS side, and write rows and statuses through
the one writer, :class:`~mdeci.broker.session_rows.SessionRows`. :meth:`connected` and
:meth:`disconnected` are the same for a session made without SIP.

A periodic task sweeps subscriptions every ``BrokerCoreConfig.sweep_interval`` and marks
every user due (which retries a batch a database error stopped).

Threads: the store is synchronous, and neither it nor the core runs on the event loop.
Every call into :class:`Broker` goes to one :class:`~mdeci.broker.worker.DbWorker`
thread, in the order the loop makes them (session rows and statuses go to the same
thread, so a row is written before its status changes and a status before the churn
event after it); the core is bound to that thread (:meth:`Broker.bind_thread`). Its
listener calls and churn events come back through a :class:`~mdeci.broker.worker.LoopQueue`:
a database that hangs delays delivery and publishes, never a SIP answer, an RUDP ack or
a keepalive. The loop reads no core state (the SMS side asks ``sub_class`` on the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from mdeci.broker.core import PRUNE_CHUNK
from mdeci.broker.glue import Broker
from mdeci.broker.links import (
    DataPeer,
    QuicDataPeerLink,
    QuicLinks,
    RudpDataPeer,
    UserLink,
    check_key,
)
from mdeci.broker.media_answer import DataChannels
from mdeci.broker.session_rows import SessionRows
from mdeci.broker.sessions import (
    Attach,
    Command,
    Detach,
    SessionManager,
    SetStatus,
    SmsLook,
    SmsStop,
    Status,
    StoreSession,
    UserSession,
)
from mdeci.broker.sms import SmsFallback
from mdeci.broker.worker import DbWorker, LoopQueue, LoopSink
from mdeci.errors import FrameError
from mdeci.frames import (
    UNAVAILABLE,
    Ack,
    CalendarOk,
    Error,
    Frame,
    List,
    Subs,
    decode_fast,
    encode,
    encode_reply,
)
from mdeci.oplog import event as oplog_event
from mdeci.store.errors import StoreError
from mdeci.tasks import spawn
from quicdata.connection import DEFAULT_CONFIG as DEFAULT_QUIC
from quicdata.connection import QuicDataConfig
from rudp.aio import PeerUnreachable, RudpEndpoint, RudpPeer
from rudp.config import RudpConfig

log = logging.getLogger("mdeci.broker")
_CONNECTED = Status.CONNECTED
_nothing = type(None)  # a worker call that does nothing: waits for the calls before it
# Chunks of msg_ids forgotten after one sweep at most (Broker.prune): a million rows.
PRUNE_CHUNKS_PER_SWEEP = 1000
# What a reply other than a listing reserves while its request is handled (see _admit):
# sub-ok, pub-ok, calendar-ok and error frames are well under this.
SMALL_REPLY = 256


class BrokerService:
    """Runs a :class:`Broker` on one RUDP endpoint; the SIP layer calls
    :meth:`connected` and :meth:`disconnected`.

    Build it with :meth:`open`, then :meth:`start` the sweep; :meth:`close` at the end.
    """

    def __init__(
        self, broker: Broker, endpoint: RudpEndpoint, worker: DbWorker | None = None
    ) -> None:
        """Build it on the event loop's thread; ``broker`` is bound to ``worker``'s thread
        (a new one if None; closed by :meth:`close`) and must not be called elsewhere."""
        self.broker = broker
        self.endpoint = endpoint
        self.worker = worker if worker is not None else DbWorker()
        self.worker.health = broker.health  # one owner of the database's health
        self._to_loop = LoopQueue(asyncio.get_running_loop())
        # The one owner of every user's session state, and the one writer of its rows.
        self.sessions = SessionManager()
        self.rows = SessionRows(broker.store, self.worker, broker.clock)
        broker.fence = self.rows  # a user's queue calls name the epoch it is held at
        # The transport side of each session (peer, sends in flight), by URI.
        self._users: dict[str, UserLink] = {}
        self._sweeper: asyncio.Task[None] | None = None
        # Frames received, not yet handled, in arrival order (link_received); the task
        # handling them.
        self._inbound: list[tuple[UserLink, bytes]] = []
        self._pump: asyncio.Task[None] | None = None
        # Users whose delivery may progress (an ordered set), and the task serving them.
        self._due: dict[UserLink, None] = {}
        self._delivery: asyncio.Task[None] | None = None
        # The channel selector and SMS side when set (run_broker; see the sms property).
        self._sms: SmsFallback | None = None
        self.refused_requests = 0  # requests answered 503 or dropped by _admit
        # [media] advertise: the relay's address in SDP; agents followed by path validation.
        self.advertise: tuple[str, int] | None = None
        # [media] transports: the data channels SDP answers accept; QUIC's server if one.
        self.accept: tuple[str, ...] = ("rudp",)
        self.quic: QuicLinks | None = None
        # The QUIC server's port as announced (behind a relay on the RUDP address's host).
        self.quic_advertise: tuple[str, int] | None = None
        broker.listener = self
        # A broker served again by a new service (a restart in-process) is not wrapped twice.
        sink = broker.log.sink if isinstance(broker.log, LoopSink) else broker.log
        broker.log = LoopSink(sink, self._to_loop)
        self._closed = False
        broker.bind_thread(self.worker.on_thread)

    @property
    def to_loop(self) -> LoopQueue:
        """Where calls made on the database thread are handed back to the event loop."""
        return self._to_loop

    @property
    def sms(self) -> SmsFallback | None:
        """Channel selection beyond IP: told of every queued notification."""
        return self._sms

    def attach_sms(self, sms: SmsFallback) -> None:
        """Serve ``sms`` (before its start): it asks this service through
        :class:`~mdeci.broker.sms.IpSide`. It removes the rows it delivered, so the core
        reads every queue it serves from the store from now on (in the worker's order)."""
        self._sms = sms
        sms.bind(self)
        self.worker.post("sms side", self.broker.forget_rows)

    @classmethod
    async def open(
        cls,
        broker: Broker,
        host: str,
        port: int = 0,
        rudp_config: RudpConfig | None = None,
        worker: DbWorker | None = None,
    ) -> BrokerService:
        """Bind the RUDP endpoint on ``host:port`` (0: any free port); ``worker`` as for
        the constructor.

        Raises :class:`OSError` if the address cannot be bound.
        """
        config = rudp_config if rudp_config is not None else RudpConfig()
        return cls(broker, await RudpEndpoint.open(host, port, config=config), worker)

    @property
    def local_addr(self) -> tuple[str, int]:
        """The media address to put in the broker's SDP answer."""
        return self.advertise or self.endpoint.local_addr

    @property
    def channels(self) -> DataChannels:
        """What SDP answers accept, and where (:mod:`mdeci.broker.media_answer`)."""
        quic = self.quic
        accept = self.accept if quic is not None else tuple(t for t in self.accept if t != "quic")
        if quic is None:
            return DataChannels(accept, self.local_addr)
        where = self.quic_advertise or quic.local_addr
        return DataChannels(accept, self.local_addr, where, quic.fingerprint)

    async def open_quic(
        self, host: str, port: int = 0, config: QuicDataConfig = DEFAULT_QUIC
    ) -> None:
        """Serve QUIC sessions on host:port (0: any free port). Raises OSError."""
        self.quic = await QuicLinks.open(host, port, config)

    def users(self) -> list[str]:
        """Each user with a data-channel peer, whatever its transport."""
        return list(self._users)

    def peers(self) -> list[tuple[str, RudpPeer]]:
        """Each user with a live RUDP association, and its peer (for the metrics)."""
        return [
            (uri, link.peer)
            for uri, link in self._users.items()
            if isinstance(link.peer, RudpDataPeer)
        ]

    def start(self) -> None:
        """Start the periodic subscription sweep (idempotent)."""
        if self._sweeper is None:
            self._sweeper = spawn(self._sweep_forever(), log, "sweep")

    # ------------------------------------------------------------------ SIP-facing

    def connected(self, uri: str, media_addr: tuple[str, int], key: bytes) -> None:
        """``uri``'s INVITE or re-INVITE completed with this media address and key:
        mark it CONNECTED and flush its queue in order from the lowest un-acked nseq.

        The same key keeps the RUDP association (the agent moved and kept its state); a
        new key replaces it with a fresh one. The same key while still CONNECTED is a
        move: delivery goes on where it was, at the new address (nothing sent twice).

        The core hears of it on the database thread, before anything queued later; a
        status that cannot be stored is logged (``database_error``), and delivery
        starts anyway.

        Raises:
            SessionKeyError: ``key`` is shorter than 16 bytes.
        """
        check_key(key)
        self.apply(self.sessions.connect(uri, media_addr, key, alive=self.alive(uri)))

    def disconnected(self, uri: str, *, ended: bool = False) -> None:
        """The SIP layer lost ``uri``'s session (``ended``: BYE): stop and forget its peer.

        Its queue stays; the next :meth:`connected` flushes it. The core hears of it on
        the database thread; a status that cannot be stored is logged.
        """
        self.apply(self.sessions.disconnect(uri, ended=ended))

    def alive(self, uri: str) -> bool:
        """``uri``'s RUDP association exists and has not given up."""
        link = self._users.get(uri)
        return link is not None and link.peer.connected

    def apply(self, commands: list[Command]) -> None:
        """Carry out the Session Manager's commands, in order (the SIP endpoint carries
        out the BYEs and churn events among them, and hands the rest here)."""
        for command in commands:
            if isinstance(command, Attach):
                self._attach(command)
            elif isinstance(command, Detach):
                self._detach(command)
            elif isinstance(command, SetStatus | StoreSession):
                self.rows.write(command)
            elif isinstance(command, SmsLook) and self.sms is not None:
                self._after_db(self.sms.kick, command.uri)
            elif isinstance(command, SmsStop) and self.sms is not None:
                self.sms.ip_back(command.uri)

    def _attach(self, command: Attach) -> None:
        session, media_addr = command.session, command.addr
        uri, key = session.uri, session.key
        link = self._users.get(uri)
        if link is not None and (link.key != key or link.peer.transport != session.transport):
            self._drop(link)
            link = None
        if command.moved and (link is None or not link.peer.connected):
            # The association gave up meanwhile (its failure is still on its way): a new
            # connection, as if it had arrived first.
            self.apply(self.sessions.connect(uri, media_addr, key, alive=False))
            return
        if command.moved and link is not None:
            # The same association, delivering: only the path changed. RUDP resends what
            # is in flight to the new address itself; restarting the stream from the
            # lowest un-acked nseq would send the whole window again on every move, and a
            # device moving often would spend its link on copies.
            # (A new address also gives the association a fresh retry budget.) Behind a
            # relay the SDP address is not where the agent's packets come from: the RUDP
            # path validation follows it instead (it also resends what is in flight).
            if self.advertise is None:
                link.peer.set_address(media_addr)
            self.worker.post("media moved", self.broker.mark_moved, uri, media_addr)
            self._kick(link)
            return
        if link is None:
            link = UserLink(self._peer(session, media_addr), session, self)
            self._users[uri] = link
            link.peer.bind(link)
        link.session = session
        if self.advertise is None or link.peer.path_changes == 0:
            link.peer.set_address(media_addr)  # behind a relay: until a path is validated
        # Always a fresh retry budget: the (re-)INVITE just proved the user reachable at
        # this address; retries spent on the old one during a move must not fail the
        # association a moment later (then nothing would bring it back: the agent, which
        # believes it is CONNECTED, has no reason to re-INVITE).
        link.peer.reset()
        # Posted before the delivery task's next take_batches: the worker runs them in order.
        self.worker.post("session status", self.broker.mark_connected, uri, media_addr)
        self._kick(link)

    def _peer(self, session: UserSession, media_addr: tuple[str, int]) -> DataPeer:
        if session.transport == "quic" and self.quic is not None:
            return QuicDataPeerLink(self.quic, session.key)
        return RudpDataPeer.open(self.endpoint, session.key, media_addr)

    def _detach(self, command: Detach) -> None:
        uri = command.uri
        if command.forget:
            link = self._users.pop(uri, None)
            if link is not None:
                self._drop(link)
        self.worker.post("session status", self.broker.mark_disconnected, uri, command.reason)

    async def settled(self) -> None:
        """Return once the database thread ran every call queued so far (e.g. the status
        writes of :meth:`connected` and :meth:`disconnected`)."""
        await self.worker.run(_nothing)

    def heard_from(self, uri: str) -> bool:
        """True once an authentic datagram came from ``uri``'s current RUDP association
        (the proof that both ends derived the same session secret)."""
        link = self._users.get(uri)
        return link is not None and link.peer.heard

    def is_connected(self, uri: str) -> bool:
        """True while notifications are being sent to ``uri`` (its session is CONNECTED)."""
        return self.sessions.is_connected(uri)

    async def close(self) -> None:
        """Stop every task and close the endpoint. Queues and statuses stay stored.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks: list[asyncio.Future[None]] = []
        for task in (self._sweeper, self._pump, self._delivery):
            if task is not None:
                task.cancel()
                tasks.append(task)
        self._sweeper = self._pump = self._delivery = None
        for link in self._users.values():
            tasks.extend(self._drop(link))
        self._users.clear()
        with contextlib.suppress(StoreError):
            # Held acks are only saved work: never fail close. Queued behind every call
            # made so far, so once it returns the worker has nothing left to run.
            await self.worker.run(self.broker.flush_acks)
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.endpoint.close()
        if self.quic is not None:
            await self.quic.close()
        self.worker.close()

    # ------------------------------------------------------------------ QueueListener
    # Called by the core on the database thread; handled on the loop.

    def queued(self, uri: str) -> None:
        self._to_loop.call(self._queued, uri)

    def acked(self, uri: str) -> None:
        self._to_loop.call(self._wake, uri)

    def _queued(self, uri: str) -> None:
        self._wake(uri)
        if self.sms is not None:
            link = self._users.get(uri)
            connected = link is not None and link.delivering
            if connected and link is not None:
                self.sms.observe_ip(uri, *link.peer.observe())
            self.sms.kick(uri, connected=connected)

    def sub_class(self, sub_id: int) -> str | None:
        """The queue class live subscription ``sub_id`` asked for, if any."""
        compiled = self.broker.matcher.get(sub_id)
        return None if compiled is None else compiled.qclass

    def handle_sms_frame(self, uri: str, data: bytes) -> None:
        """A ``pub`` or ``ack`` from ``uri``'s phone by SMS: handled as over IP (on the
        database thread, in order); the answers stay there (an ``error`` is logged by
        the core's churn events)."""
        self.worker.post("sms frame", self.broker.handle_frame, uri, data)

    def delivered_by_sms(self, uri: str, nseq: int) -> None:
        """``uri``'s ``nseq`` went by SMS: the core forgets it was also in flight over IP
        (on the database thread, in order)."""
        self.worker.post("sms delivered", self.broker.delivered_elsewhere, uri, nseq)

    def tell(self, uri: str, data: bytes) -> bool:
        """Send a broker-initiated frame (e.g. ``limit``) to ``uri`` if it is CONNECTED."""
        link = self._users.get(uri)
        if link is None or not link.delivering:
            return False
        self._spawn_sends(link, [data])
        return True

    def _after_db(self, fn: Callable[[str], object], uri: str) -> None:
        """``fn(uri)`` on the loop once the database thread ran every call queued so far:
        the SMS side reads the queue, so the disconnection's held acks must be applied
        first (or it would send by SMS what the user acknowledged over IP)."""
        self.worker.post("hand back", self._to_loop.call, fn, uri)

    def _wake(self, uri: str) -> None:
        link = self._users.get(uri)
        if link is not None:
            self._kick(link)

    # ------------------------------------------------------------------ tasks

    def _drop(self, link: UserLink) -> list[asyncio.Future[None]]:
        tasks = [t for t in (link.sends or ()) if t is not None]
        for task in tasks:
            task.cancel()
        link.peer.close()
        return tasks

    def link_received(self, link: UserLink, data: bytes) -> None:
        # Handled once the loop has delivered what already arrived (the pump task runs
        # after the callbacks of this loop pass), so that publishes arriving together share
        # one commit (Broker.handle_frames); frames keep their arrival order. A dropped
        # link's peer is closed first: it calls this no more.
        self._inbound.append((link, data))
        if self._pump is None:
            self._pump = spawn(self._handle_inbound(), log, "inbound frames")

    async def _handle_inbound(self) -> None:
        try:
            while self._inbound:
                batch, self._inbound = self._inbound, []
                reserved: dict[UserLink, int] = {}
                admitted: list[tuple[UserLink, Frame | FrameError]] = []
                for link, data in batch:
                    frame = self._admit(link, data, reserved)
                    if frame is not None:
                        admitted.append((link, frame))
                # The users whose acks are in this batch get their window refilled in the
                # same worker call (Broker.handle_and_take), not by a wake-up and another.
                acking = {
                    link.uri: (link, link.epoch)
                    for link, frame in admitted
                    if isinstance(frame, Ack)
                    and link.delivering
                    and self._users.get(link.uri) is link
                }
                replies, batches = await self.worker.run(
                    self.broker.handle_and_take,
                    [(link.uri, frame) for link, frame in admitted],
                    frozenset(acking),
                )
                self._reply([link for link, _ in admitted], replies)
                for uri, items in batches.items():
                    link, epoch = acking[uri]
                    if link.epoch != epoch or not link.delivering:
                        continue  # as in _deliver: the mark_* behind the call resends
                    self._send_notifies(link, [item.data for item in items])
        finally:
            self._pump = None

    def _reply(self, links: list[UserLink], replies: list[list[Frame]]) -> None:
        # Each user's replies of this round leave as one batch (one future, one callback:
        # a round of publishes from one publisher is up to a window of pub-oks).
        out: dict[UserLink, list[bytes]] = {}
        for link, frames in zip(links, replies, strict=True):
            if self._users.get(link.uri) is not link:
                continue  # dropped meanwhile: as if its reader had been cancelled first
            for frame in frames:
                if isinstance(frame, CalendarOk) and self.sms is not None:
                    self.sms.calendar_changed(link.uri)  # decide again with it
                try:
                    reply = encode_reply(frame)
                except FrameError as exc:  # e.g. a `subs` listing over the frame limit
                    reply = encode(Error(req=exc.req, code=exc.code, message=exc.message))
                if isinstance(frame, Subs):
                    link.listing_bytes = len(reply)  # what the next `list` will reserve
                out.setdefault(link, []).append(reply)
        for link, data in out.items():
            self._spawn_replies(link, data)

    def _admit(
        self, link: UserLink, data: bytes, reserved: dict[UserLink, int]
    ) -> Frame | FrameError | None:
        """This frame decoded (or its decoding error) if it is to be handled, None if not:
        handled unless its user holds more than ``max_unacked_reply_bytes`` of our replies
        unacknowledged (over QUIC, of anything: ``DataPeer.backlog``) and it is a request
        (an ``ack`` always passes: it is how the user gets below the cap again).

        The replies of the frames admitted in this round are not sent yet, so each
        admitted request reserves what its reply will likely take (``reserved``): the
        size of the user's last listing for a ``list``, ``SMALL_REPLY`` for the rest.
        A refused request is answered ``error`` 503 while the user holds less than
        twice the cap, and dropped beyond that, so the memory one user can hold stays
        bounded whatever it sends; the first refusal of a streak is logged.
        """
        try:
            frame: Frame | FrameError = decode_fast(data)
        except FrameError as exc:
            frame = exc  # the core answers it (400); a small reply
        if isinstance(frame, Ack):
            return frame
        cap = self.broker.config.max_unacked_reply_bytes
        held = link.reply_bytes + link.peer.backlog + reserved.get(link, 0)
        if held <= cap:
            if link.refusing:
                link.refusing = False
            cost = link.listing_bytes if isinstance(frame, List) else SMALL_REPLY
            reserved[link] = reserved.get(link, 0) + cost
            return frame
        if not link.refusing:
            link.refusing = True
            oplog_event(
                "requests_refused",
                level=logging.WARNING,
                uri=link.uri,
                reason=f"{held} bytes of replies unacknowledged (cap {cap})",
            )
        self.refused_requests += 1
        if held <= 2 * cap:
            req = getattr(frame, "req", None)
            text = "too many unacknowledged replies; acknowledge, then retry"
            self._spawn_replies(link, [encode(Error(req=req, code=UNAVAILABLE, message=text))])
        return None

    def _spawn_replies(self, link: UserLink, data: list[bytes]) -> None:
        # The replies' bytes count against the cap until their send is done; released by
        # the send's one callback (_sent), not by a second one per reply (a
        # publish's pub-ok took two callbacks and two loop steps).
        size = sum(map(len, data))
        if self._spawn_sends(link, data, size) is not None:
            link.reply_bytes += size

    def _kick(self, link: UserLink) -> None:
        """``link``'s delivery may progress: serve it in the delivery task's next call."""
        if self._closed or not link.delivering:
            return
        self._due[link] = None
        if self._delivery is None:
            self._delivery = spawn(self._deliver(), log, "delivery")

    async def _deliver(self) -> None:
        try:
            while self._due:
                links = [
                    link
                    for link in self._due
                    if link.delivering and self._users.get(link.uri) is link
                ]
                self._due.clear()
                if not links:
                    continue
                epochs = [link.epoch for link in links]
                try:
                    batches = await self.worker.run(
                        self.broker.take_batches, [link.uri for link in links]
                    )
                except StoreError as exc:
                    self.broker.health.failed("delivery", exc)
                    continue  # retried on the next wake (publish, ack or sweep tick)
                self.broker.health.succeeded()
                for link, epoch in zip(links, epochs, strict=True):
                    if link.epoch != epoch or not link.delivering:
                        # (Re)connected, dropped or unreachable since the call began: the
                        # mark_* queued behind it put what it took back to be sent from
                        # the lowest un-acked nseq.
                        continue
                    items = batches.get(link.uri)
                    if items:
                        # Refused at once (unreachable): all go after the next connection.
                        self._send_notifies(link, [item.data for item in items])
        finally:
            self._delivery = None

    def _send_notifies(self, link: UserLink, data: list[bytes]) -> None:
        """Queue notifies on ``link``'s peer, in order: with a future until the path is
        proved (:meth:`_spawn_sends`), then without (one per user and round cost a fan-out
        ~10 % of its CPU): a failure then comes by the peer's ``on_gone`` (_attach)."""
        if not link.session.proved:
            self._spawn_sends(link, data)
            return
        try:
            link.peer.write_many(data)
        except PeerUnreachable as exc:
            self._unreachable(link, link.epoch, exc.reason)

    def _spawn_sends(
        self, link: UserLink, data: list[bytes], reply_size: int = 0
    ) -> asyncio.Future[None] | None:
        """Queue the messages of ``data`` on ``link``'s peer, in order; the one future of
        their acknowledgement (None if the peer refused them at once: then the user is
        marked unreachable). Its callback (no task per message) gives back
        ``reply_size`` bytes of ``link.reply_bytes`` (see _spawn_replies)."""
        epoch = link.epoch
        try:
            future = link.peer.send_many_nowait(data)
        except PeerUnreachable as exc:
            self._unreachable(link, epoch, exc.reason)
            return None
        if link.sends is None:
            link.sends = set()
        link.sends.add(future)
        future.add_done_callback(lambda done: self._sent(link, done, epoch, reply_size))
        return future

    def _sent(
        self, link: UserLink, future: asyncio.Future[None], epoch: int, reply_size: int = 0
    ) -> None:
        link.reply_bytes -= reply_size
        if link.sends is not None:
            link.sends.discard(future)
            if not link.sends:
                link.sends = None  # an idle session holds no set
        if future.cancelled():
            return
        exc = future.exception()
        if isinstance(exc, PeerUnreachable):
            self._unreachable(link, epoch, exc.reason)
        elif exc is None and not link.session.proved and epoch == link.epoch:
            self._proved(link, epoch)

    def _proved(self, link: UserLink, epoch: int) -> None:
        """The first datagram sent over this connection was acknowledged: IP works both
        ways, so the SMS side stops its buffers for the user (:meth:`SmsFallback.ip_back`).

        Not at the (re-)INVITE: a device whose SIP works while its IP downlink does not
        (a half-broken radio, a firewall dropping UDP towards it) re-INVITEs again and
        again; stopping its SMS at each one and sending it again when IP fails anew would
        pay every SMS twice or more, and send a notification that reached the phone by
        SMS once more.
        """
        if self._users.get(link.uri) is link:
            self.apply(self.sessions.path_proved(link.uri, epoch))

    def _unreachable(self, link: UserLink, epoch: int, reason: str) -> None:
        if self._users.get(link.uri) is not link:
            return  # a send of an earlier connection: its failure says nothing now
        # The stored status follows at the next change if the database is down now.
        self.apply(self.sessions.media_failed(link.uri, epoch, reason))

    def link_gone(self, link: UserLink, reason: str) -> None:
        """``link``'s association ended (messages written without a future failed)."""
        self._unreachable(link, link.epoch, reason)

    def link_heard(self, link: UserLink) -> None:
        """An authenticated packet (a frame, an ack or a keepalive PING) came from the
        user: the keys are confirmed, and a user we marked DISCONNECTED after RUDP
        retries ran out is reachable again, so it is connected again exactly as a
        re-INVITE with the same key would connect it.

        Without this, an agent that was frozen (suspended, SIGSTOP), or whose move made
        our retries go to its old address, never got its queue: its own keepalives are
        still acknowledged, so it sends no frame and no re-INVITE, while we waited for one.
        """
        session = link.session
        if session.heard and session.status is _CONNECTED:
            return  # the common case: one check per datagram
        if self._users.get(link.uri) is not link:
            return
        addr = link.peer.addr or session.media_addr
        self.apply(self.sessions.media_heard(link.uri, session.epoch, addr))

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.broker.config.sweep_interval)
            try:
                await self.worker.run(self.broker.sweep)
                # Chunks until one comes back short: the first prune of a large table
                # takes several sweeps' worth of chunks, each its own worker call.
                for _ in range(PRUNE_CHUNKS_PER_SWEEP):
                    if await self.worker.run(self.broker.prune) < PRUNE_CHUNK:
                        break
            except StoreError as exc:
                # Retried at the next sweep; the matcher already ignores expired ones.
                self.broker.health.failed("sweep", exc)
            else:
                self.broker.health.succeeded()
            for link in self._users.values():
                self._kick(link)
