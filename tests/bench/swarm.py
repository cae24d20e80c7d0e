"""Many agents set up against one broker from one process, for the session-memory
benchmark.

A :class:`sip.aio.ua.UserAgent` per agent costs a socket and a transaction layer each;
ten thousand of them would measure this process, not the broker. Here one UDP socket
speaks SIP for every agent: each agent sends a real digest REGISTER and a real INVITE
whose offer carries its X25519 value (``build_offer``), answers the 401 challenge (the
INVITE carries the REGISTER's credentials ahead, as the agent's UA sends them), ACKs
the 2xx, derives the RUDP session secret from the answer exactly as the agent does
(:class:`tests.keyx.OfferKeys`), and subscribes over a real RUDP peer of one shared
:class:`rudp.aio.RudpEndpoint`. Requests are retransmitted as a UAC would (T1 doubling,
bounded), so a datagram the busy broker drops costs time, not the run.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from mdeci.frames import Sub, SubOk, decode, encode
from rudp.aio import DEFAULT_CONFIG, RudpEndpoint, RudpPeer
from rudp.config import RudpConfig
from rudp.sockets import SOCKET_BUFFER, set_socket_buffers
from sip.auth import DigestClient
from sip.errors import SipParseError
from sip.headers import Headers
from sip.message import Request, Response, parse_message
from sip.sdp import build_offer, parse_session
from sip.ua import UaConfig
from sip.uac import PADDING
from tests.keyx import OfferKeys

Address = tuple[str, int]
T1 = 0.5  # RFC 3261 T1: first retransmission interval (s)
PAD_TO = UaConfig(aor="sip:swarm@invalid").pad_to
TRIES = 7  # sends of one request before the agent gives up (0.5 + 1 + ... + 32 s)


class SwarmError(Exception):
    """A request of one agent got a final failure (``status``) or no answer (408)."""

    def __init__(self, message: str, status: int = 408) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Session:
    """What one agent keeps of its session: its dialog (for a re-INVITE), its keys and
    the RUDP peer of the current key."""

    user: str
    call_id: str
    tag: str  # our From tag
    to: str  # the To header of the 2xx (the broker's tag)
    target: str  # the broker's Contact: the Request-URI of in-dialog requests
    cseq: int
    version: int  # of our SDP origin
    digest: DigestClient  # its last challenge: the credentials sent ahead
    keys: OfferKeys
    key: bytes  # the RUDP session secret
    media: Address  # the broker's media address
    peer: RudpPeer


@dataclass(slots=True)
class _Pending:
    data: bytes
    future: asyncio.Future[Response]
    proceeding: bool = False  # a 1xx came: the server has it, stop resending (§17.1.1.2)


class _SipSocket(asyncio.DatagramProtocol):
    """One UDP socket; responses are matched to requests by their Via branch."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: dict[str, _Pending] = {}
        self.acked: dict[str, bytes] = {}  # branch of an answered INVITE -> its ACK
        self.retransmits = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            msg = parse_message(data)
        except SipParseError:
            return
        if not isinstance(msg, Response):
            return
        branch = msg.top_via.branch or ""
        if msg.status < 200:
            if (provisional := self.pending.get(branch)) is not None:
                provisional.proceeding = True
            return
        ack = self.acked.get(branch)
        if ack is not None:  # the 2xx again: our ACK was lost
            self.send(ack, (str(addr[0]), int(addr[1])))
            return
        pending = self.pending.get(branch)
        if pending is not None and not pending.future.done():
            pending.future.set_result(msg)

    def send(self, data: bytes, dest: Address) -> None:
        assert self.transport is not None
        self.transport.sendto(data, dest)


class Swarm:
    """Agents ``users`` of ``domain`` (password ``password(user)``), set up in batches."""

    def __init__(
        self, sip: _SipSocket, rudp: RudpEndpoint, domain: str, broker_aor: str, host: str
    ) -> None:
        self._sip = sip
        self.rudp = rudp
        self.domain = domain
        self.broker_aor = broker_aor
        self.host = host
        self.peers: list[RudpPeer] = []

    @classmethod
    async def open(
        cls, host: str, domain: str, broker_aor: str, config: RudpConfig = DEFAULT_CONFIG
    ) -> Swarm:
        """``config``: the RUDP settings of every agent's peer."""
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_datagram_endpoint(_SipSocket, local_addr=(host, 0))
        assert protocol.transport is not None
        set_socket_buffers(protocol.transport.get_extra_info("socket"), SOCKET_BUFFER)
        rudp = await RudpEndpoint.open(host, 0, config)
        return cls(protocol, rudp, domain, broker_aor, host)

    @property
    def retransmits(self) -> int:
        return self._sip.retransmits

    @property
    def _port(self) -> int:
        assert self._sip.transport is not None
        return int(self._sip.transport.get_extra_info("sockname")[1])

    async def close(self) -> None:
        await self.rudp.close()
        if self._sip.transport is not None:
            self._sip.transport.close()

    # ------------------------------------------------------------------ SIP

    def _request(
        self,
        method: str,
        uri: str,
        user: str,
        *,
        to: str,
        call_id: str,
        from_tag: str,
        cseq: int,
        branch: str,
        extra: str = "",
        body: bytes = b"",
        pad: bool = True,
    ) -> bytes:
        aor = f"sip:{user}@{self.domain}"
        head = (
            f"{method} {uri} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {self.host}:{self._port};branch={branch};rport\r\n"
            "Max-Forwards: 70\r\n"
            f"From: <{aor}>;tag={from_tag}\r\n"
            f"To: {to}\r\n"
            f"Call-ID: {call_id}\r\n"
            f"CSeq: {cseq} {method}\r\n"
            f"Contact: <sip:{user}@{self.host}:{self._port}>\r\n"
            f"{extra}" + ("Content-Type: application/sdp\r\n" if body else "")
        )
        tail = f"Content-Length: {len(body)}\r\n\r\n"
        # Padded as the agent's UA pads a new request (UaConfig.pad_to): the broker
        # answers an unproven request over UDP with at most its own size.
        short = PAD_TO - len(head) - len(tail) - len(body) - len(PADDING + ": \r\n")
        if method not in ("ACK", "CANCEL") and pad and short > 0:
            head += f"{PADDING}: {'x' * short}\r\n"
        return (head + tail).encode() + body

    async def _exchange(self, data: bytes, branch: str, dest: Address) -> Response:
        """Send, resend at T1, 2·T1, ... until a final response; raise SwarmError at last."""
        loop = asyncio.get_running_loop()
        pending = _Pending(data, loop.create_future())
        self._sip.pending[branch] = pending
        try:
            wait = T1
            for attempt in range(TRIES):
                if not attempt:
                    self._sip.send(data, dest)
                elif not pending.proceeding:
                    self._sip.retransmits += 1
                    self._sip.send(data, dest)
                done, _ = await asyncio.wait({pending.future}, timeout=wait)
                if done:
                    return pending.future.result()
                wait *= 2
            raise SwarmError(f"no answer after {TRIES} sends: {data[:40]!r}")
        finally:
            del self._sip.pending[branch]

    async def _authenticated(
        self,
        method: str,
        uri: str,
        user: str,
        client: DigestClient,
        dest: Address,
        *,
        to: str,
        extra: str = "",
        body: bytes = b"",
        dialog: tuple[str, str, int] | None = None,
    ) -> tuple[Response, str, str, int]:
        """The request, with ``client``'s credentials sent ahead once it saw a challenge,
        then its retry with Digest after a 401, as the agent's UA does
        (sip.uac.UacCore); the final response, Call-ID, From tag and CSeq of the last
        request. ``dialog``: (Call-ID, From tag, last CSeq) of an in-dialog request;
        None: a new Call-ID."""
        call_id, tag, last = dialog or (secrets.token_hex(8), secrets.token_hex(4), 0)
        response = Response(0, "")
        ahead = client.preemptive(method, uri)
        sent = Headers()
        if ahead is not None:
            sent.add(*ahead)
        for cseq in (last + 1, last + 2):
            branch = "z9hG4bK" + secrets.token_hex(8)
            auth = "".join(f"{name}: {value}\r\n" for name, value in sent)
            data = self._request(
                method, uri, user, to=to, call_id=call_id, from_tag=tag, cseq=cseq,
                branch=branch, extra=extra + auth, body=body, pad=cseq == last + 1,
            )  # fmt: skip
            response = await self._exchange(data, branch, dest)
            if method == "INVITE":
                self._ack(response, uri, user, call_id, tag, cseq, branch, dest)
            if response.status != 401:
                return response, call_id, tag, cseq
            name, value = client.respond(response, Request(method, uri, sent))
            sent = Headers()
            sent.add(name, value)
        raise SwarmError(
            f"{method} of {user}: {response.status} {response.reason}", response.status
        )

    def _ack(
        self,
        response: Response,
        uri: str,
        user: str,
        call_id: str,
        tag: str,
        cseq: int,
        branch: str,
        dest: Address,
    ) -> None:
        """ACK a final response to INVITE (a non-2xx in its transaction, a 2xx in a new
        one, §17.1.1.3 and §13.2.2.4); a 2xx's ACK is kept to answer its retransmissions."""
        ack_branch = branch if response.status >= 300 else "z9hG4bK" + secrets.token_hex(8)
        ack = self._request(
            "ACK", uri, user, to=response.headers.get("To") or "", call_id=call_id,
            from_tag=tag, cseq=cseq, branch=ack_branch,
        )  # fmt: skip
        self._sip.send(ack, dest)
        if response.status < 300:
            self._sip.acked[branch] = ack

    async def connect(self, user: str, password: str, broker: Address, subject: str) -> Session:
        """REGISTER, INVITE with a key offer, ACK, then subscribe to ``subject`` over RUDP
        under the derived key. Raises SwarmError, PeerUnreachable."""
        aor = f"sip:{user}@{self.domain}"
        client = DigestClient(user, password, secrets.token_bytes)
        reg, *_ = await self._authenticated(
            "REGISTER", f"sip:{self.domain}", user, client, broker,
            to=f"<{aor}>", extra="Expires: 3600\r\n",
        )  # fmt: skip
        if reg.status != 200:
            raise SwarmError(f"REGISTER of {user}: {reg.status} {reg.reason}")
        keys = OfferKeys(user, self.domain, password)
        offer = build_offer(user, 1, 1, self.host, self.rudp.local_addr[1], keys.public).encode()
        answer, call_id, tag, cseq = await self._authenticated(
            "INVITE", self.broker_aor, user, client, broker,
            to=f"<{self.broker_aor}>", body=offer,
        )  # fmt: skip
        if answer.status != 200:
            raise SwarmError(f"INVITE of {user}: {answer.status} {answer.reason}")
        media = parse_session(answer.body)
        assert media.key is not None
        key = keys.secret(media.key, offer, answer.body)
        peer = self.rudp.peer(key, (media.addr, media.port))
        self.peers.append(peer)
        await peer.send(encode(Sub(req=1, subject=subject)))
        reply = decode(await peer.receive())
        if not isinstance(reply, SubOk):
            raise SwarmError(f"subscription of {user}: {reply}")
        to, contact = answer.headers.get("To") or "", answer.headers.get("Contact") or ""
        target = contact.strip().removeprefix("<").partition(">")[0] or self.broker_aor
        return Session(
            user, call_id, tag, to, target, cseq, 1, client, keys, key,
            (media.addr, media.port), peer,
        )  # fmt: skip

    async def reinvite(
        self, session: Session, password: str, broker: Address, *, in_dialog: bool = True
    ) -> None:
        """A re-INVITE in ``session``'s dialog (``in_dialog``) or an INVITE of a new one,
        with a new key offer, as the agent sends them after losing its broker: on the
        2xx, ``session`` holds the dialog, the new key and media address (the caller
        makes the peer). Raises SwarmError."""
        keys = OfferKeys(session.user, self.domain, password)
        version = session.version + 1
        port = self.rudp.local_addr[1]
        offer = build_offer(session.user, 1, version, self.host, port, keys.public).encode()
        what = "re-INVITE" if in_dialog else "INVITE"
        if in_dialog:
            target, to = session.target, session.to
            dialog: tuple[str, str, int] | None = (session.call_id, session.tag, session.cseq)
        else:
            target, to, dialog = self.broker_aor, f"<{self.broker_aor}>", None
        answer, call_id, tag, cseq = await self._authenticated(
            "INVITE", target, session.user, session.digest, broker, to=to, body=offer,
            dialog=dialog,
        )  # fmt: skip
        if in_dialog:
            session.cseq = cseq
        if answer.status != 200:
            raise SwarmError(f"{what}: {answer.status} {answer.reason}", answer.status)
        if not in_dialog:
            contact = answer.headers.get("Contact") or ""
            session.call_id, session.tag, session.cseq = call_id, tag, cseq
            session.to = answer.headers.get("To") or ""
            session.target = contact.strip().removeprefix("<").partition(">")[0] or target
        media = parse_session(answer.body)
        assert media.key is not None
        session.version, session.keys = version, keys
        session.key = keys.secret(media.key, offer, answer.body)
        session.media = (media.addr, media.port)


async def set_up(
    swarm: Swarm,
    users: list[str],
    password: dict[str, str],
    broker: Address,
    concurrency: int,
    limit: float,
    subject: Callable[[str], str] = lambda user: f"rss.{user}",
) -> list[Session]:
    """Connect every user with ``concurrency`` set-ups in flight; ``limit`` seconds for
    all. Each subscribes to ``subject(user)``."""
    room = asyncio.Semaphore(concurrency)

    async def one(user: str) -> Session:
        async with room:
            return await swarm.connect(user, password[user], broker, subject(user))

    return await asyncio.wait_for(asyncio.gather(*(one(u) for u in users)), limit)
