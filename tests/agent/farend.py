"""A small SIP + RUDP far end for the agent tests, until the broker's SIP side lands.

One :class:`sip.aio.ua.UserAgent` plays registrar (every REGISTER gets 200) and UAS: an
INVITE or re-INVITE carrying our SDP is answered with :func:`sip.sdp.build_answer` and
hands the session to :meth:`mdeci.broker.BrokerService.connected`, as ``sip/tools/uas.py``
and the future ``mdeci/broker/sip.py`` do.
"""

from __future__ import annotations

from pathlib import Path

from mdeci.broker import Broker, BrokerService
from mdeci.config import (
    AgentConfig,
    AgentMediaConfig,
    AgentRegistrarConfig,
    BrokerPeerConfig,
    ChurnLogConfig,
    HostPort,
    IpMonitorConfig,
    IpMonitorMode,
    ReconnectConfig,
    SipConfig,
)
from rudp.config import RudpConfig
from sip.aio.ua import IncomingRequest, Reply, UaConfig, UserAgent
from sip.errors import SdpError
from sip.sdp import build_answer, parse_session
from sip.transaction import TimerConfig
from sip.uri import SipUri
from tests.broker.conftest import add_session
from tests.keyx import OfferKeys

BROKER_AOR = "sip:broker@localhost"
BROKER_HOST = "127.0.0.1"
GUARD = 15.0  # seconds; guards against a hang, synchronises nothing
# RUDP gives up after ~0.35 s without an ACK; SIP transactions time out after 64*T1.
FAST_RUDP = RudpConfig(rto_initial=0.05, rto_min=0.02, rto_max=0.1, max_retries=2, ack_delay=0.005)
FAST_SIP = TimerConfig(t1=0.02, t2=0.16, t4=0.2)


class FarEnd:
    """Registrar + UAS + BrokerService on loopback."""

    def __init__(self, broker: Broker, sip_port: int = 0) -> None:
        self.broker = broker
        self.sip_port = sip_port
        self.service: BrokerService | None = None
        self.ua: UserAgent | None = None
        self.version = 0
        self.secrets: dict[str, tuple[bytes, bytes]] = {}  # aor -> (agent public, secret)

    async def start(self) -> FarEnd:
        self.service = await BrokerService.open(self.broker, BROKER_HOST, 0, FAST_RUDP)
        self.service.start()
        self.ua = UserAgent(
            UaConfig(aor=BROKER_AOR, timers=FAST_SIP, methods=frozenset({"INVITE", "REGISTER"})),
            self.handle,
        )
        _, self.sip_port = await self.ua.start(BROKER_HOST, self.sip_port)
        return self

    async def stop(self) -> None:
        if self.ua is not None:
            await self.ua.close()
        if self.service is not None:
            await self.service.close()

    async def handle(self, req: IncomingRequest) -> Reply:
        request = req.request
        if request.method == "REGISTER":
            return Reply(200, headers=(("Expires", request.headers.get("Expires") or "600"),))
        if request.method != "INVITE":
            return Reply(200)
        assert self.service is not None
        try:
            offer = parse_session(request.body, require_key=True)
            self.version += 1
            host, port = self.service.local_addr
        except SdpError:
            return Reply(488)
        uri = request.from_.uri
        assert isinstance(uri, SipUri) and uri.user is not None and offer.key is not None
        aor = f"sip:{uri.user}@{uri.host}"
        # The broker's side of the key schedule; keys kept while the agent offers the
        # same public value (a move), as the real broker does.
        kept = self.secrets.get(aor)
        if kept is not None and kept[0] == offer.key:
            answer = build_answer(request.body, "broker", 1, self.version, host, port).encode()
            secret = kept[1]
        else:
            keys = OfferKeys(uri.user, uri.host, f"{uri.user}-secret")
            answer = build_answer(
                request.body, "broker", 1, self.version, host, port, key=keys.public
            ).encode()
            secret = keys.secret(offer.key, request.body, answer)
            self.secrets[aor] = (offer.key, secret)
        add_session(self.service.broker.store, aor)
        self.service.connected(aor, (offer.addr, offer.port), secret)
        return Reply(200, body=answer)


def agent_config(state: Path, user: str, host: str, far: FarEnd | int) -> AgentConfig:
    """An agent of ``user`` bound to ``host``, talking to ``far`` (or a broker's SIP port
    on 127.0.0.1), with quick timers; its password is ``<user>-secret``."""
    sip_addr = HostPort(BROKER_HOST, far if isinstance(far, int) else far.sip_port)
    return AgentConfig(
        aor=f"sip:{user}@localhost",
        password=f"{user}-secret",
        node=f"{user}-phone",
        state_dir=state,
        api_socket=state / "agent.sock",
        registrar=AgentRegistrarConfig(address=sip_addr),
        broker=BrokerPeerConfig(aor=BROKER_AOR, address=sip_addr),
        sip=SipConfig(host=host, port=0, t1=FAST_SIP.t1, t2=FAST_SIP.t2, t4=FAST_SIP.t4),
        media=AgentMediaConfig(host=host),
        rudp=FAST_RUDP,
        reconnect=ReconnectConfig(base=0.05, max=0.2, jitter=0.2),
        ip_monitor=IpMonitorConfig(mode=IpMonitorMode.POLL, poll_interval=600.0),
        churnlog=ChurnLogConfig(path=state / "churn.log"),
    )


def lo_only() -> frozenset[str]:
    """An address source whose loopback network never changes."""
    return frozenset({"127.0.0.1/8"})
