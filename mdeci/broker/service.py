"""The asyncio service around :class:`~mdeci.broker.core.Broker`: RUDP peers and tasks.

Glue only, as ``rudp/aio`` is for its core. One :class:`~rudp.aio.RudpEndpoint` serves
every user; per connected user there is one :class:`~rudp.aio.RudpPeer` (keyed by the
session secret agreed through SDP, docs/security.md) and three kinds of task:

- a reader: ``peer.receive()`` -> ``Broker.handle_frames`` (what every reader received
  by then, so publishes arriving together share one commit) -> replies sent on the peer;
- a delivery task: ``Broker.take_batch`` -> one send task per notify, started in nseq
  order (asyncio runs tasks in creation order, so the RUDP core queues them in order);
  when the batch is empty it waits on the user's wake event, set by the core's
  :class:`~mdeci.broker.core.QueueListener` calls (a publish queued something, an ack
  freed the window): no polling;
- send tasks: ``await peer.send(...)``; a :class:`~rudp.aio.PeerUnreachable` marks the
  user DISCONNECTED (only if it belongs to the current connection: each
  :meth:`BrokerService.connected` starts a new epoch) and stops the delivery task.

A periodic task runs the subscription sweep every ``BrokerCoreConfig.sweep_interval``
and wakes every delivery task, which also retries a batch a database error stopped.

The store is synchronous; its calls run on the event loop (short transactions).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from mdeci.broker.core import Broker
from mdeci.broker.errors import SessionKeyError
from mdeci.broker.sms import SmsFallback
from mdeci.errors import FrameError
from mdeci.frames import UNAVAILABLE, Ack, CalendarOk, Error, decode, encode
from mdeci.oplog import event as oplog_event
from mdeci.store.errors import StoreError
from mdeci.store.sessions import SessionStatus
from rudp.aio import PeerUnreachable, RudpEndpoint, RudpPeer
from rudp.config import RudpConfig

MIN_KEY_BYTES = 16  # what RudpConnection accepts


@dataclass(slots=True, eq=False)
class _UserLink:
    uri: str
    key: bytes
    peer: RudpPeer
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    epoch: int = 0
    reader: asyncio.Task[None] | None = None
    delivery: asyncio.Task[None] | None = None
    sends: set[asyncio.Task[None]] = field(default_factory=set)
    # Bytes of replies sent and not yet acknowledged by the user's RUDP (see _admit).
    reply_bytes: int = 0
    refusing: bool = False  # over the cap: its requests are answered 503, logged once


def _addr_text(addr: tuple[str, int]) -> str:
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BrokerService:
    """Runs a :class:`Broker` on one RUDP endpoint; the SIP layer calls
    :meth:`connected` and :meth:`disconnected`.

    Build it with :meth:`open`, then :meth:`start` the sweep; :meth:`close` at the end.
    """

    def __init__(self, broker: Broker, endpoint: RudpEndpoint) -> None:
        self.broker = broker
        self.endpoint = endpoint
        self._users: dict[str, _UserLink] = {}
        self._sweeper: asyncio.Task[None] | None = None
        # Frames received and not yet handled, in arrival order (see _read).
        self._inbound: list[tuple[_UserLink, bytes]] = []
        # The channel selector and SMS side when set (run_broker; see the sms property).
        self._sms: SmsFallback | None = None
        self.refused_requests = 0  # requests answered 503 or dropped by _admit
        broker.listener = self

    @property
    def sms(self) -> SmsFallback | None:
        """Channel selection beyond IP (issue 13): told of every queued notification."""
        return self._sms

    @sms.setter
    def sms(self, sms: SmsFallback | None) -> None:
        self._sms = sms
        if sms is not None:
            sms.tell = self._tell
            sms.connected = self.broker.is_connected
            sms.handle_frame = self._sms_frame
            sms.sub_class = self._sub_class

    @classmethod
    async def open(
        cls, broker: Broker, host: str, port: int = 0, rudp_config: RudpConfig | None = None
    ) -> BrokerService:
        """Bind the RUDP endpoint on ``host:port`` (0: any free port).

        Raises :class:`OSError` if the address cannot be bound.
        """
        config = rudp_config if rudp_config is not None else RudpConfig()
        return cls(broker, await RudpEndpoint.open(host, port, config=config))

    @property
    def local_addr(self) -> tuple[str, int]:
        """The media address to put in the broker's SDP answer."""
        return self.endpoint.local_addr

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

        Raises:
            SessionKeyError: ``key`` is shorter than 16 bytes.
            StoreError: the status could not be stored (delivery starts anyway).
        """
        if len(key) < MIN_KEY_BYTES:
            raise SessionKeyError(f"session key of {len(key)} bytes; need {MIN_KEY_BYTES}")
        link = self._users.get(uri)
        if link is not None and link.key != key:
            self._drop(link)
            link = None
        if link is not None and link.peer.connected and self.broker.is_connected(uri):
            # The same association, delivering: only the path changed. RUDP resends what
            # is in flight to the new address itself; restarting the stream from the
            # lowest un-acked nseq would send the whole window again on every move, and a
            # device moving often would spend its link on copies.
            # (A new address also gives the association a fresh retry budget.)
            link.peer.set_address(media_addr)
            self.broker.mark_moved(uri, _addr_text(media_addr))
            link.wake.set()
            return
        if link is None:
            link = _UserLink(uri, key, self.endpoint.peer(key, media_addr))
            self._users[uri] = link
            link.peer.on_heard = lambda: self._heard(link)
            link.reader = asyncio.create_task(self._read(link))
        elif link.delivery is not None:
            link.delivery.cancel()
        link.peer.set_address(media_addr)
        # Always a fresh retry budget: the (re-)INVITE just proved the user reachable at
        # this address; retries spent on the old one during a move must not fail the
        # association a moment later (then nothing would bring it back: the agent, which
        # believes it is CONNECTED, has no reason to re-INVITE).
        link.peer.reset()
        link.epoch += 1
        if self.sms is not None:
            self.sms.ip_back(uri)
        try:
            self.broker.mark_connected(uri, _addr_text(media_addr))
        finally:
            link.delivery = asyncio.create_task(self._deliver(link, link.epoch))

    def disconnected(self, uri: str, *, ended: bool = False) -> None:
        """The SIP layer lost ``uri``'s session (``ended``: BYE): stop and forget its peer.

        Its queue stays; the next :meth:`connected` flushes it.

        Raises:
            StoreError: the status could not be stored (delivery is stopped anyway).
        """
        link = self._users.pop(uri, None)
        if link is not None:
            self._drop(link)
        status = SessionStatus.ENDED if ended else SessionStatus.DISCONNECTED
        self.broker.mark_disconnected(uri, "session ended" if ended else "sip", status)
        if self.sms is not None and not ended:
            self.sms.kick(uri)

    def heard_from(self, uri: str) -> bool:
        """True once an authentic datagram came from ``uri``'s current RUDP association
        (the proof that both ends derived the same session secret)."""
        link = self._users.get(uri)
        return link is not None and link.peer.stats.packets_received > 0

    def is_connected(self, uri: str) -> bool:
        """True while notifications are being sent to ``uri``."""
        return self.broker.is_connected(uri)

    async def close(self) -> None:
        """Stop every task and close the endpoint. Queues and statuses stay stored."""
        tasks: list[asyncio.Task[None]] = []
        if self._sweeper is not None:
            self._sweeper.cancel()
            tasks.append(self._sweeper)
            self._sweeper = None
        for link in self._users.values():
            tasks.extend(self._drop(link))
        self._users.clear()
        with contextlib.suppress(StoreError):
            self.broker.flush_acks()  # held acks are only saved work: never fail close
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.endpoint.close()

    # ------------------------------------------------------------------ QueueListener

    def queued(self, uri: str) -> None:
        self.acked(uri)
        if self.sms is not None:
            connected = self.broker.is_connected(uri)
            link = self._users.get(uri)
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
        """A ``pub`` or ``ack`` from ``uri``'s phone by SMS: handled as over IP; the
        answers stay here (an ``error`` is logged by the core's churn events)."""
        self.broker.handle_frame(uri, data)

    def _tell(self, uri: str, data: bytes) -> bool:
        """Send a broker-initiated frame (e.g. ``limit``) to ``uri`` if it is CONNECTED."""
        link = self._users.get(uri)
        if link is None or not self.broker.is_connected(uri):
            return False
        self._spawn_send(link, data)
        return True

    def acked(self, uri: str) -> None:
        link = self._users.get(uri)
        if link is not None:
            link.wake.set()

    # ------------------------------------------------------------------ tasks

    def _drop(self, link: _UserLink) -> list[asyncio.Task[None]]:
        tasks = [t for t in (link.reader, link.delivery, *link.sends) if t is not None]
        for task in tasks:
            task.cancel()
        link.epoch += 1  # whatever still completes belongs to no connection
        self.endpoint.remove_peer(link.key)
        return tasks

    async def _read(self, link: _UserLink) -> None:
        while True:
            data = await link.peer.receive()
            # Handled once every reader has taken what already arrived (a reader does not
            # yield while its inbox has frames), so that publishes arriving together share
            # one commit (Broker.handle_frames); frames keep their arrival order.
            if not self._inbound:
                asyncio.get_running_loop().call_soon(self._handle_inbound)
            self._inbound.append((link, data))

    def _handle_inbound(self) -> None:
        batch, self._inbound = self._inbound, []
        batch = [(link, data) for link, data in batch if self._admit(link, data)]
        replies = self.broker.handle_frames([(link.uri, data) for link, data in batch])
        for (link, _), frames in zip(batch, replies, strict=True):
            if self._users.get(link.uri) is not link:
                continue  # dropped meanwhile: as if its reader had been cancelled first
            for frame in frames:
                if isinstance(frame, CalendarOk) and self.sms is not None:
                    self.sms.calendar_changed(link.uri)  # decide again with it
                try:
                    reply = encode(frame)
                except FrameError as exc:  # e.g. a `subs` listing over the frame limit
                    reply = encode(Error(req=exc.req, code=exc.code, message=exc.message))
                self._spawn_reply(link, reply)

    def _admit(self, link: _UserLink, data: bytes) -> bool:
        """Whether to handle this frame: yes, unless its user holds more than
        ``max_unacked_reply_bytes`` of our replies unacknowledged and it is a request
        (an ``ack`` always passes: it is how the user gets below the cap again).

        A refused request is answered ``error`` 503 while the user holds less than
        twice the cap, and dropped beyond that, so the memory one user can hold stays
        bounded whatever it sends; the first refusal of a streak is logged.
        """
        cap = self.broker.config.max_unacked_reply_bytes
        if link.reply_bytes <= cap:
            link.refusing = False
            return True
        try:
            frame = decode(data)
        except FrameError:
            frame = None
        if isinstance(frame, Ack):
            return True
        if not link.refusing:
            link.refusing = True
            oplog_event(
                "requests_refused",
                level=logging.WARNING,
                uri=link.uri,
                reason=f"{link.reply_bytes} bytes of replies unacknowledged (cap {cap})",
            )
        self.refused_requests += 1
        if link.reply_bytes <= 2 * cap:
            req = getattr(frame, "req", None)
            text = "too many unacknowledged replies; acknowledge, then retry"
            self._spawn_reply(link, encode(Error(req=req, code=UNAVAILABLE, message=text)))
        return False

    def _spawn_reply(self, link: _UserLink, data: bytes) -> None:
        link.reply_bytes += len(data)
        task = self._spawn_send(link, data)
        task.add_done_callback(lambda _: self._replied(link, len(data)))

    @staticmethod
    def _replied(link: _UserLink, size: int) -> None:
        link.reply_bytes -= size

    async def _deliver(self, link: _UserLink, epoch: int) -> None:
        while link.epoch == epoch:
            try:
                batch = self.broker.take_batch(link.uri)
            except StoreError:
                batch = []  # retried on the next wake (publish, ack or sweep tick)
            if not batch:
                await link.wake.wait()
                link.wake.clear()
                continue
            for item in batch:
                self._spawn_send(link, item.data)

    def _spawn_send(self, link: _UserLink, data: bytes) -> asyncio.Task[None]:
        task = asyncio.create_task(self._send(link, data, link.epoch))
        link.sends.add(task)
        task.add_done_callback(link.sends.discard)
        return task

    async def _send(self, link: _UserLink, data: bytes, epoch: int) -> None:
        try:
            await link.peer.send(data)
        except PeerUnreachable as exc:
            self._unreachable(link, epoch, exc.reason)

    def _unreachable(self, link: _UserLink, epoch: int, reason: str) -> None:
        if epoch != link.epoch or self._users.get(link.uri) is not link:
            return  # a send of an earlier connection: its failure says nothing now
        if not self.broker.is_connected(link.uri):
            return
        if link.delivery is not None:
            link.delivery.cancel()
            link.delivery = None
        # The in-memory state changed already; the stored status follows at the next
        # change if the database is down now.
        with contextlib.suppress(StoreError):
            self.broker.mark_disconnected(link.uri, f"rudp: {reason}")
        if self.sms is not None:
            self.sms.kick(link.uri)

    def _heard(self, link: _UserLink) -> None:
        """An authenticated packet (a frame, an ack or a keepalive PING) came from a user
        we marked DISCONNECTED after RUDP retries ran out: it is reachable again, so it is
        connected again exactly as a re-INVITE with the same key would connect it.

        Without this, an agent that was frozen (suspended, SIGSTOP), or whose move made
        our retries go to its old address, never got its queue: its own keepalives are
        still acknowledged, so it sends no frame and no re-INVITE, while we waited for one.
        """
        if self._users.get(link.uri) is not link or self.broker.is_connected(link.uri):
            return
        # A failed status write leaves delivery enabled; the store follows at the next change.
        with contextlib.suppress(StoreError):
            self.connected(link.uri, link.peer.addr, link.key)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.broker.config.sweep_interval)
            with contextlib.suppress(StoreError):
                self.broker.sweep()
            for link in self._users.values():
                link.wake.set()
