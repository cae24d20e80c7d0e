"""The asyncio service around :class:`~mdeci.broker.core.Broker`: RUDP peers and tasks.

Glue only, as ``rudp/aio`` is for its core. One :class:`~rudp.aio.RudpEndpoint` serves
every user; per connected user there is one :class:`~rudp.aio.RudpPeer` (keyed by the
session secret agreed through SDP, docs/security.md), and tasks only while there is
work (issue 14: an idle session holds no task, event or queue, for memory):

- inbound: the peer's ``on_message`` callback appends to the inbound list; one pump
  task hands what every peer delivered by then, decoded (once, to admit it), to
  ``Broker.handle_decoded`` (publishes arriving together share one commit; what arrives
  while that call runs is the next call's batch, so a busy broker commits once per
  database round trip, not once per frame) -> replies sent on the peer, in the order
  the frames came;
- one delivery task for every user: the users whose delivery may progress (the core's
  :class:`~mdeci.broker.core.QueueListener` calls: a publish queued something, an ack
  freed the window; a connection) are marked due, and the task hands all of them to
  ``Broker.take_batches`` in one worker call (a fan-out wakes a hundred users at once:
  one call, one transaction for their held acks, one connection for their reads) -> each
  notify queued on the RUDP peer at once, in nseq order (``write``; ``send_nowait`` for
  a batch's last: no task per message, one future per batch); what is marked due during
  the call is the next call's: no polling;
- sends: the future of each queued message; a :class:`~rudp.aio.PeerUnreachable` (at
  once, or when its retries run out) marks the user DISCONNECTED (only if it belongs to
  the current connection: each :meth:`BrokerService.connected` starts a new epoch) and
  stops its delivery.

A periodic task runs the subscription sweep every ``BrokerCoreConfig.sweep_interval``
and marks every user due, which also retries a batch a database error stopped.

Threads: the store is synchronous, and neither it nor the core runs on the event loop.
Every call into :class:`Broker` goes to one :class:`~mdeci.broker.worker.DbWorker`
thread, in the order the loop makes them (the SIP endpoint's store calls go to the same
thread, so a session row is written before its status changes); the core is bound to
that thread (:meth:`Broker.bind_thread`). Its listener calls and churn events come back
to the loop through a :class:`~mdeci.broker.worker.LoopQueue`. So a database that hangs
delays delivery and publishes, never a SIP answer, an RUDP ack or a keepalive.

The loop keeps its own view of who is CONNECTED (:attr:`_UserLink.delivering`, set by
:meth:`connected`, cleared by :meth:`disconnected` and by a failed send); the core's
view follows it in the same order, one worker call later. :meth:`is_connected` answers
from the loop's view. The loop reads no core state: the SMS side asks its ``sub_class``
from its plans, on the worker (mdeci/broker/sms.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import cbor2

from mdeci.broker.core import PRUNE_CHUNK, Broker
from mdeci.broker.errors import SessionKeyError
from mdeci.broker.sms import SmsFallback
from mdeci.broker.worker import DbWorker, LoopQueue, LoopSink
from mdeci.errors import FrameError
from mdeci.frames import (
    MAX_FRAME_BYTES,
    UINT63,
    UNAVAILABLE,
    Ack,
    CalendarOk,
    Error,
    Frame,
    List,
    Pub,
    PubOk,
    Subs,
    decode,
    encode,
)
from mdeci.oplog import event as oplog_event
from mdeci.store.errors import StoreError
from mdeci.store.sessions import SessionStatus
from rudp.aio import PeerUnreachable, RudpEndpoint, RudpPeer
from rudp.config import RudpConfig

MIN_KEY_BYTES = 16  # what RudpConnection accepts
# Chunks of msg_ids forgotten after one sweep at most (Broker.prune): a million rows.
PRUNE_CHUNKS_PER_SWEEP = 1000
# What a reply other than a listing reserves while its request is handled (see _admit):
# sub-ok, pub-ok, calendar-ok and error frames are well under this.
SMALL_REPLY = 256


@dataclass(slots=True, eq=False)
class _UserLink:
    uri: str
    key: bytes
    peer: RudpPeer
    epoch: int = 0
    delivering: bool = False  # the loop's view of CONNECTED (see the module docstring)
    sends: set[asyncio.Future[None]] | None = None  # only while sends are in flight
    # Bytes of replies sent and not yet acknowledged by the user's RUDP (see _admit).
    reply_bytes: int = 0
    listing_bytes: int = 16384  # the size of this user's last `subs` (see _admit)
    refusing: bool = False  # over the cap: its requests are answered 503, logged once
    # The SMS side was told IP is back for this connection (see _proved): only once a
    # datagram sent over it was acknowledged, not when the (re-)INVITE completed.
    ip_proved: bool = True


def _nothing() -> None:
    pass


# An ``ack`` frame as every agent encodes it (``encode``: op first), less its integer.
_ACK_PREFIX = encode(Ack(upto=0))[:-1]
_UINT_SIZES = {24: 1, 25: 2, 26: 4, 27: 8}  # CBOR unsigned heads with a following integer


# A ``pub`` frame as every agent encodes it without attrs, urgent or qclass (``encode``:
# op, req, msg_id, subject, then payload unless empty): its fixed items.
_PUB_HEAD = cbor2.dumps("op") + cbor2.dumps(Pub.op) + cbor2.dumps("req")
_K_MSG_ID = cbor2.dumps("msg_id")
_K_SUBJECT = cbor2.dumps("subject")
_K_PAYLOAD = cbor2.dumps("payload")
_PUB_MAPS = (0xA4, 0xA5)  # CBOR maps of 4 and 5 items


def _head(data: bytes, pos: int, major: int) -> tuple[int, int]:
    """The argument of the definite-length CBOR head of type ``major`` at ``pos`` and the
    position after it; ValueError or IndexError for anything else."""
    byte = data[pos]
    if byte >> 5 != major:
        raise ValueError("another type")
    info = byte & 0x1F
    if info < 24:
        return info, pos + 1
    size = _UINT_SIZES[info]  # KeyError (a LookupError) for indefinite or reserved
    end = pos + 1 + size
    if end > len(data):
        raise IndexError("short")
    return int.from_bytes(data[pos + 1 : end], "big"), end


def _decode_pub(data: bytes) -> Pub | None:
    """The ``pub`` frame of ``data`` if it has exactly the usual shape (see _PUB_HEAD),
    built by ``Pub`` itself (so with all its checks); None for anything else, including
    a frame ``Pub`` refuses: the general decoder then gives the frame or the error."""
    try:
        pos = 1 + len(_PUB_HEAD)
        req, pos = _head(data, pos, 0)
        if not data.startswith(_K_MSG_ID, pos):
            return None
        size, pos = _head(data, pos + len(_K_MSG_ID), 3)
        msg_id = data[pos : pos + size].decode("utf-8")
        pos += size
        if not data.startswith(_K_SUBJECT, pos):
            return None
        size, pos = _head(data, pos + len(_K_SUBJECT), 3)
        subject = data[pos : pos + size].decode("utf-8")
        pos += size
        payload = b""
        if data[0] == 0xA5:
            if not data.startswith(_K_PAYLOAD, pos):
                return None
            size, pos = _head(data, pos + len(_K_PAYLOAD), 2)
            payload = data[pos : pos + size]
            pos += size
        if pos != len(data) or len(data) > MAX_FRAME_BYTES:
            return None
        return Pub(req=req, msg_id=msg_id, subject=subject, payload=payload)
    except (ValueError, LookupError, FrameError):  # UnicodeDecodeError is a ValueError
        return None


def decode_fast(data: bytes) -> Frame:
    """``decode(data)``, with short cuts for the commonest frames, an ``ack`` (one per
    notification; the general decoder's checks cost as much as handling it) and a
    ``pub`` without attrs (one per publish): the same frame or :class:`FrameError` for
    any input (tests/broker/test_notify_encoding.py)."""
    if data[:1] and data[0] in _PUB_MAPS and data.startswith(_PUB_HEAD, 1):
        pub = _decode_pub(data)
        if pub is not None:
            return pub
        return decode(data)
    start = len(_ACK_PREFIX)
    if data.startswith(_ACK_PREFIX) and len(data) > start:
        head = data[start]
        if head < 24 and len(data) == start + 1:
            return Ack(upto=head)
        size = _UINT_SIZES.get(head)
        if size is not None and len(data) == start + 1 + size:
            value = int.from_bytes(data[start + 1 :], "big")
            if value <= UINT63:
                return Ack(upto=value)
    return decode(data)


def encode_reply(frame: Frame) -> bytes:
    """``encode(frame)``, with a short cut for the commonest reply, a ``pub-ok`` (one per
    publish; the general encoder walks the dataclass's fields and defaults): the same
    bytes (tests/broker/test_notify_encoding.py). A ``pub-ok`` has no field with a
    default, so ``encode`` writes all three after ``op``, in this order."""
    if type(frame) is PubOk:
        # Far below MAX_FRAME_BYTES: msg_id is at most MAX_ID_LENGTH characters.
        return cbor2.dumps(
            {"op": "pub-ok", "req": frame.req, "msg_id": frame.msg_id, "matched": frame.matched}
        )
    return encode(frame)


def _addr_text(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
        self._to_loop = LoopQueue(asyncio.get_running_loop())
        self._users: dict[str, _UserLink] = {}
        self._sweeper: asyncio.Task[None] | None = None
        # Frames received and not yet handled, in arrival order (see _received), and the task
        # handing them to the core.
        self._inbound: list[tuple[_UserLink, bytes]] = []
        self._pump: asyncio.Task[None] | None = None
        # Users whose delivery may progress (an ordered set), and the task serving them.
        self._due: dict[_UserLink, None] = {}
        self._delivery: asyncio.Task[None] | None = None
        # The channel selector and SMS side when set (run_broker; see the sms property).
        self._sms: SmsFallback | None = None
        self.refused_requests = 0  # requests answered 503 or dropped by _admit
        # [media] advertise: the relay's address, announced in SDP; agents are then
        # followed by path validation only (see connected).
        self.advertise: tuple[str, int] | None = None
        broker.listener = self
        # A broker served again by a new service (a restart in-process) is not wrapped twice.
        sink = broker.log.sink if isinstance(broker.log, LoopSink) else broker.log
        broker.log = LoopSink(sink, self._to_loop)
        self._closed = False
        broker.bind_thread(self.worker.thread_id)

    @property
    def to_loop(self) -> LoopQueue:
        """Where calls made on the database thread are handed back to the event loop."""
        return self._to_loop

    @property
    def sms(self) -> SmsFallback | None:
        """Channel selection beyond IP (issue 13): told of every queued notification."""
        return self._sms

    @sms.setter
    def sms(self, sms: SmsFallback | None) -> None:
        self._sms = sms
        if sms is not None:
            sms.tell = self._tell
            sms.worker = self.worker
            sms.connected = self.is_connected
            sms.handle_frame = self._sms_frame
            sms.sub_class = self._sub_class
            sms.delivered = self._sms_delivered
            # The SMS side removes the rows it delivered: the core reads every queue it
            # serves from the store from now on (the order of the worker's calls).
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

    def peers(self) -> list[tuple[str, RudpPeer]]:
        """Each user with a live RUDP association, and its peer (for the metrics)."""
        return [(uri, link.peer) for uri, link in self._users.items()]

    def start(self) -> None:
        """Start the periodic subscription sweep (idempotent)."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever())

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
        if len(key) < MIN_KEY_BYTES:
            raise SessionKeyError(f"session key of {len(key)} bytes; need {MIN_KEY_BYTES}")
        link = self._users.get(uri)
        if link is not None and link.key != key:
            self._drop(link)
            link = None
        if link is not None and link.peer.connected and link.delivering:
            # The same association, delivering: only the path changed. RUDP resends what
            # is in flight to the new address itself; restarting the stream from the
            # lowest un-acked nseq would send the whole window again on every move, and a
            # device moving often would spend its link on copies.
            # (A new address also gives the association a fresh retry budget.) Behind a
            # relay the SDP address is not where the agent's packets come from: the RUDP
            # path validation follows it instead (it also resends what is in flight).
            if self.advertise is None:
                link.peer.set_address(media_addr)
            self.worker.post("media moved", self.broker.mark_moved, uri, _addr_text(media_addr))
            self._kick(link)
            return
        if link is None:
            link = _UserLink(uri, key, self.endpoint.peer(key, media_addr))
            self._users[uri] = link
            link.peer.on_heard = lambda: self._heard(link)
            link.peer.on_message = lambda data: self._received(link, data)
        if self.advertise is None or link.peer.path_changes == 0:
            link.peer.set_address(media_addr)  # behind a relay: until a path is validated
        # Always a fresh retry budget: the (re-)INVITE just proved the user reachable at
        # this address; retries spent on the old one during a move must not fail the
        # association a moment later (then nothing would bring it back: the agent, which
        # believes it is CONNECTED, has no reason to re-INVITE).
        link.peer.reset()
        link.epoch += 1
        link.delivering = True
        link.ip_proved = False  # the SMS side hears of it at the first acknowledged send
        # Posted before the delivery task's next take_batches: the worker runs them in order.
        self.worker.post("session status", self.broker.mark_connected, uri, _addr_text(media_addr))
        self._kick(link)

    def disconnected(self, uri: str, *, ended: bool = False) -> None:
        """The SIP layer lost ``uri``'s session (``ended``: BYE): stop and forget its peer.

        Its queue stays; the next :meth:`connected` flushes it. The core hears of it on
        the database thread; a status that cannot be stored is logged.
        """
        link = self._users.pop(uri, None)
        if link is not None:
            self._drop(link)
        status = SessionStatus.ENDED if ended else SessionStatus.DISCONNECTED
        reason = "session ended" if ended else "sip"
        self.worker.post("session status", self.broker.mark_disconnected, uri, reason, status)
        if self.sms is not None and not ended:
            self._after_db(self.sms.kick, uri)

    async def settled(self) -> None:
        """Return once the database thread ran every call queued so far (e.g. the status
        writes of :meth:`connected` and :meth:`disconnected`)."""
        await self.worker.run(_nothing)

    def heard_from(self, uri: str) -> bool:
        """True once an authentic datagram came from ``uri``'s current RUDP association
        (the proof that both ends derived the same session secret)."""
        link = self._users.get(uri)
        return link is not None and link.peer.stats.packets_received > 0

    def is_connected(self, uri: str) -> bool:
        """True while notifications are being sent to ``uri`` (the loop's view)."""
        link = self._users.get(uri)
        return link is not None and link.delivering

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
                conn = link.peer.connection
                srtt = conn.rto.srtt
                stats = conn.stats
                self.sms.observe_ip(
                    uri,
                    None if srtt is None else srtt * 1000.0,
                    stats.data_sent,
                    stats.retransmissions,
                )
            self.sms.kick(uri, connected=connected)

    def _sub_class(self, sub_id: int) -> str | None:
        """The queue class live subscription ``sub_id`` asked for, if any."""
        compiled = self.broker.matcher.get(sub_id)
        return None if compiled is None else compiled.sub.qclass

    def _sms_frame(self, uri: str, data: bytes) -> None:
        """A ``pub`` or ``ack`` from ``uri``'s phone by SMS: handled as over IP (on the
        database thread, in order); the answers stay there (an ``error`` is logged by
        the core's churn events)."""
        self.worker.post("sms frame", self.broker.handle_frame, uri, data)

    def _sms_delivered(self, uri: str, nseq: int) -> None:
        """``uri``'s ``nseq`` went by SMS: the core forgets it was also in flight over IP
        (on the database thread, in order)."""
        self.worker.post("sms delivered", self.broker.delivered_elsewhere, uri, nseq)

    def _tell(self, uri: str, data: bytes) -> bool:
        """Send a broker-initiated frame (e.g. ``limit``) to ``uri`` if it is CONNECTED."""
        link = self._users.get(uri)
        if link is None or not link.delivering:
            return False
        self._spawn_send(link, data)
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

    def _drop(self, link: _UserLink) -> list[asyncio.Future[None]]:
        tasks = [t for t in (link.sends or ()) if t is not None]
        for task in tasks:
            task.cancel()
        link.epoch += 1  # whatever still completes belongs to no connection
        link.delivering = False
        self.endpoint.remove_peer(link.key)
        return tasks

    def _received(self, link: _UserLink, data: bytes) -> None:
        # Handled once the loop has delivered what already arrived (the pump task runs
        # after the callbacks of this loop pass), so that publishes arriving together share
        # one commit (Broker.handle_frames); frames keep their arrival order. A dropped
        # link's peer is closed first: it calls this no more.
        self._inbound.append((link, data))
        if self._pump is None:
            self._pump = asyncio.create_task(self._handle_inbound())

    async def _handle_inbound(self) -> None:
        try:
            while self._inbound:
                batch, self._inbound = self._inbound, []
                reserved: dict[_UserLink, int] = {}
                admitted: list[tuple[_UserLink, Frame | FrameError]] = []
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
                    self._spawn_sends(link, [item.data for item in items])
        finally:
            self._pump = None

    def _reply(self, links: list[_UserLink], replies: list[list[Frame]]) -> None:
        # Each user's replies of this round leave as one batch (one future, one callback:
        # a round of publishes from one publisher is up to a window of pub-oks).
        out: dict[_UserLink, list[bytes]] = {}
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
        self, link: _UserLink, data: bytes, reserved: dict[_UserLink, int]
    ) -> Frame | FrameError | None:
        """This frame decoded (or its decoding error) if it is to be handled, None if not:
        handled unless its user holds more than
        ``max_unacked_reply_bytes`` of our replies unacknowledged and it is a request
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
        held = link.reply_bytes + reserved.get(link, 0)
        if held <= cap:
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
            self._spawn_reply(link, encode(Error(req=req, code=UNAVAILABLE, message=text)))
        return None

    def _spawn_reply(self, link: _UserLink, data: bytes) -> None:
        self._spawn_replies(link, [data])

    def _spawn_replies(self, link: _UserLink, data: list[bytes]) -> None:
        # The replies' bytes count against the cap until their send is done; released by
        # the send's one callback (_sent), not by a second one per reply (issue 14: a
        # publish's pub-ok took two callbacks and two loop steps).
        size = sum(map(len, data))
        if self._spawn_sends(link, data, size) is not None:
            link.reply_bytes += size

    def _kick(self, link: _UserLink) -> None:
        """``link``'s delivery may progress: serve it in the delivery task's next call."""
        if self._closed or not link.delivering:
            return
        self._due[link] = None
        if self._delivery is None:
            self._delivery = asyncio.create_task(self._deliver())

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
                except StoreError:
                    continue  # retried on the next wake (publish, ack or sweep tick)
                for link, epoch in zip(links, epochs, strict=True):
                    if link.epoch != epoch or not link.delivering:
                        # (Re)connected, dropped or unreachable since the call began: the
                        # mark_* queued behind it put what it took back to be sent from
                        # the lowest un-acked nseq.
                        continue
                    items = batches.get(link.uri)
                    if items:
                        # Refused at once (unreachable): all go after the next connection.
                        self._spawn_sends(link, [item.data for item in items])
        finally:
            self._delivery = None

    def _spawn_send(self, link: _UserLink, data: bytes) -> asyncio.Future[None] | None:
        return self._spawn_sends(link, [data])

    def _spawn_sends(
        self, link: _UserLink, data: list[bytes], reply_size: int = 0
    ) -> asyncio.Future[None] | None:
        """Queue the messages of ``data`` on ``link``'s peer, in order; the future of
        their acknowledgement, all of them (None if the peer refused them at once: then
        the user is marked unreachable). No task per message, and one future for a
        window of notifies or a round of replies (issue 14: a task, then a future and
        its callback per notify were a visible share of a delivery's CPU): the future's
        callback does what the task did when it ended, and gives back ``reply_size``
        bytes of ``link.reply_bytes`` (see _spawn_replies)."""
        epoch = link.epoch
        try:
            if len(data) == 1:
                future = link.peer.send_nowait(data[0])
            else:
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
        self, link: _UserLink, future: asyncio.Future[None], epoch: int, reply_size: int = 0
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
        elif exc is None and not link.ip_proved and epoch == link.epoch:
            self._proved(link)

    def _proved(self, link: _UserLink) -> None:
        """The first datagram sent over this connection was acknowledged: IP works both
        ways, so the SMS side stops its buffers for the user (:meth:`SmsFallback.ip_back`).

        Not at the (re-)INVITE: a device whose SIP works while its IP downlink does not
        (a half-broken radio, a firewall dropping UDP towards it) re-INVITEs again and
        again; stopping its SMS at each one and sending it again when IP fails anew paid
        every SMS twice or more, and a notification that had reached the phone by SMS was
        sent to it once more.
        """
        link.ip_proved = True
        if self.sms is not None:
            self.sms.ip_back(link.uri)

    def _unreachable(self, link: _UserLink, epoch: int, reason: str) -> None:
        if epoch != link.epoch or self._users.get(link.uri) is not link:
            return  # a send of an earlier connection: its failure says nothing now
        if not link.delivering:
            return
        link.delivering = False
        # The stored status follows at the next change if the database is down now.
        self.worker.post(
            "session status", self.broker.mark_disconnected, link.uri, f"rudp: {reason}"
        )
        if self.sms is not None:
            self._after_db(self.sms.kick, link.uri)

    def _heard(self, link: _UserLink) -> None:
        """An authenticated packet (a frame, an ack or a keepalive PING) came from a user
        we marked DISCONNECTED after RUDP retries ran out: it is reachable again, so it is
        connected again exactly as a re-INVITE with the same key would connect it.

        Without this, an agent that was frozen (suspended, SIGSTOP), or whose move made
        our retries go to its old address, never got its queue: its own keepalives are
        still acknowledged, so it sends no frame and no re-INVITE, while we waited for one.
        """
        if self._users.get(link.uri) is not link or link.delivering:
            return
        # A failed status write leaves delivery enabled; the store follows at the next change.
        self.connected(link.uri, link.peer.addr, link.key)

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
                oplog_event("database_error", level=logging.ERROR, where="sweep", error=str(exc))
            for link in self._users.values():
                self._kick(link)
