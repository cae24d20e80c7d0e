"""The agent's sections (``configs/agent.toml``) and their loader."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from mdeci.channels.calendar import Rule, WeeklyCalendar
from mdeci.channels.networks import Network
from mdeci.config.common import (
    E164,
    SIP_AOR,
    AgentMediaConfig,
    ChurnLogConfig,
    HostPort,
    SipConfig,
    SmsGatewayKind,
    _check,
)
from mdeci.config.reader import _in, _read_toml, _Reader
from rudp.config import RudpConfig


class IpMonitorMode(StrEnum):
    """How the agent notices that its address changed."""

    NETLINK = "netlink"  # pyroute2 link, address and route events (Linux)
    POLL = "poll"  # read links, addresses and routes every poll_interval


# An idle agent finds a dead broker within keepalive_interval + dead_after = 9 s (a
# PING after 5 s of silence, given up 4 s later), at one 35-byte PING and one 40-byte
# ACK per 5 s: docs/agent.md "Noticing a dead broker" states the cost.
AGENT_RUDP: typing.Final = RudpConfig(keepalive_interval=5.0, dead_after=4.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerPeerConfig:
    """``[broker]`` in agent.toml: whom to INVITE, and where to send it."""

    aor: str = "sip:broker@localhost"
    address: HostPort = HostPort("127.0.0.1", 5060)
    realm: str = ""  # the broker's digest realm (its auth.realm); empty: the AOR's domain

    def __post_init__(self) -> None:
        _check(bool(SIP_AOR.fullmatch(self.aor)), f"'aor' {self.aor!r} is not sip:user@domain")


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentRegistrarConfig:
    """``[registrar]`` in agent.toml: the home registrar (docs/protocol.md §2)."""

    address: HostPort = HostPort("127.0.0.1", 5060)
    expires: int = 600  # Expires asked in REGISTER; refreshed before it runs out

    def __post_init__(self) -> None:
        _check(self.expires >= 1, "'expires' must be >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReconnectConfig:
    """``[reconnect]``: exponential back-off between attempts (seconds)."""

    base: float = 1.0
    max: float = 60.0
    jitter: float = 0.2  # each delay is scaled by a random factor in [1 - jitter, 1 + jitter]
    warn_after: float = 2.0  # an attempt unanswered this long is reported (it goes on)

    def __post_init__(self) -> None:
        _check(0 < self.base <= self.max, "need 0 < base <= max")
        _check(self.warn_after > 0, "'warn_after' must be > 0")
        _check(0 <= self.jitter <= 1, "'jitter' must be within 0..1")


@dataclass(frozen=True, kw_only=True, slots=True)
class IpMonitorConfig:
    """``[ip_monitor]``: address change detection."""

    mode: IpMonitorMode = IpMonitorMode.NETLINK
    poll_interval: float = 2.0  # seconds between full dumps (poll mode; netlink's guard)
    # Pin the agent to this interface (follow its addresses only); None: follow the
    # source address of the route to the broker, across interfaces.
    interface: str | None = None

    def __post_init__(self) -> None:
        _check(self.poll_interval > 0, "'poll_interval' must be > 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentSmsConfig:
    """``[sms]`` in agent.toml: take notifications by SMS from ``broker_number``.

    ``window``: how far below the highest ``nseq`` a not-yet-seen one is still accepted
    (SMS reorders; docs/sms.md "Exactly once to the application").
    """

    enabled: bool = False
    broker_number: str = "+15550000000"
    window: int = 1024
    # The phone's SMS interface (docs/sms.md "The device's gateway"): smsbox
    # of a Kannel on (or beside) the device, or an SMPP account.
    gateway: SmsGatewayKind = SmsGatewayKind.KANNEL
    kannel_sendsms_url: str = "http://127.0.0.1:13013/cgi-bin/sendsms"
    kannel_username: str = "mdeci"
    kannel_password: str = field(default="", repr=False)
    kannel_callback: HostPort = HostPort("127.0.0.1", 13081)  # Kannel's get-url target
    smpp_address: HostPort = HostPort("127.0.0.1", 2775)
    smpp_system_id: str = "mdeci"
    smpp_password: str = field(default="", repr=False)
    ack_timeout: float = 200.0  # the SMS link's (docs/sms.md)
    first_part_ack: bool = True
    publish_urgent: bool = True  # an urgent publish while IP is down also goes by SMS

    def __post_init__(self) -> None:
        _check(bool(E164.fullmatch(self.broker_number)), "'broker_number' is not E.164")
        _check(self.window >= 0, "'window' must be >= 0")
        _check(self.ack_timeout > 0, "'ack_timeout' must be > 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkKindConfig:
    """One ``[[network.kinds]]``: an access-network kind (``wifi``, ``cellular`` ...),
    its figures, and how the agent recognises it: by the interface that carries the
    route to the broker (``interfaces``) or by the local address (``prefixes``)."""

    kind: str
    price_per_mb: float = 0.0  # money per MB (2^20 bytes), billed pro rata
    energy_mw: float = 1000.0
    latency_ms: float = 100.0  # the best latency observed on it, until measured better
    coverage: float = 1.0  # the best coverage (0 < V <= 1) observed on it
    interfaces: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()  # address ranges, "10.1.0.0/16"

    def __post_init__(self) -> None:
        self.network()  # PolicyError (a ValueError) names the bad value
        for prefix in self.prefixes:
            try:
                ipaddress.ip_network(prefix, strict=False)
            except ValueError:
                _check(False, f"network {self.kind}: {prefix!r} is not an address range")

    def network(self) -> Network:
        return Network(
            kind=self.kind,
            price_per_mb=self.price_per_mb,
            energy_mw=self.energy_mw,
            latency_ms=self.latency_ms,
            coverage=self.coverage,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkConfig:
    """``[network]``: the access-network kinds, and the battery level to report where
    the platform gives none (None: unknown)."""

    kinds: tuple[NetworkKindConfig, ...] = ()
    battery: float | None = None

    def __post_init__(self) -> None:
        names = [k.kind for k in self.kinds]
        _check(len(set(names)) == len(names), f"network kinds must be unique: {names}")
        if self.battery is not None:
            _check(0 <= self.battery <= 1, "'battery' must be within 0..1")

    def kind_of(self, address: str | None, interface: str | None = None) -> str | None:
        """The kind of the network that carries ``address`` (via ``interface``, when
        known): the first kind naming the interface, else the first whose range holds
        the address; None when none does."""
        if interface is not None:
            for k in self.kinds:
                if interface in k.interfaces:
                    return k.kind
        if address is None:
            return None
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        for k in self.kinds:
            if any(ip in ipaddress.ip_network(p, strict=False) for p in k.prefixes):
                return k.kind
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class CalendarRuleConfig:
    """One ``[[calendar.rules]]``: ``channel`` (a network kind, or ``sms``) is there with
    probability ``p`` on ``weekdays`` (0 = Monday) from ``start_hour`` to ``end_hour``
    (local time); a later rule overrides an earlier one."""

    channel: str
    p: float
    weekdays: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6)
    start_hour: int = 0
    end_hour: int = 24

    def __post_init__(self) -> None:
        _check(bool(self.channel) and len(self.channel) <= 64, "'channel' must be 1..64 chars")
        _check(0 <= self.p <= 1, "'p' must be within 0..1")
        _check(bool(self.weekdays), "'weekdays' must not be empty")
        _check(all(0 <= d <= 6 for d in self.weekdays), "'weekdays' must be within 0..6")
        _check(
            0 <= self.start_hour <= self.end_hour <= 24, "need 0 <= start_hour <= end_hour <= 24"
        )

    @property
    def weekday_bits(self) -> int:
        """The weekdays as the ``calendar`` frame's bit set (bit 0 Monday)."""
        return sum(1 << d for d in set(self.weekdays))

    def rule(self) -> Rule:
        return Rule(
            channel=self.channel,
            p=self.p,
            weekdays=frozenset(self.weekdays),
            start_hour=self.start_hour,
            end_hour=self.end_hour,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentCalendarConfig:
    """``[calendar]``: the device's weekly calendar of networks, sent to the broker at
    every session start and used by the agent's own decisions."""

    utc_offset_minutes: int = 0
    rules: tuple[CalendarRuleConfig, ...] = ()

    def __post_init__(self) -> None:
        _check(-840 <= self.utc_offset_minutes <= 840, "'utc_offset_minutes' within -840..840")
        _check(len(self.rules) <= 64, "at most 64 rules")

    def calendar(self) -> WeeklyCalendar | None:
        """The calendar of these rules; None without any."""
        if not self.rules:
            return None
        return WeeklyCalendar.from_rules(
            (r.rule() for r in self.rules), utc_offset_minutes=self.utc_offset_minutes
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentConfig:
    """Everything ``mdeci agent`` needs (``configs/agent.toml``).

    ``aor`` and the password have no default. ``state_dir`` keeps the nseq file and the
    outgoing buffer; ``api_socket`` and the churn log default to files inside it.
    """

    aor: str
    password: str = field(repr=False)
    node: str = "agent"  # instance name in churn logs
    msisdn: str | None = None  # E.164; announced in SDP (a=mdeci-msisdn) for SMS fallback
    state_dir: Path = Path("var/agent")
    api_socket: Path = Path("agent.sock")  # Unix socket of the local API; in state_dir
    registrar: AgentRegistrarConfig = field(default_factory=AgentRegistrarConfig)
    broker: BrokerPeerConfig = field(default_factory=BrokerPeerConfig)
    # Any free port (TLS too). The agent sends over the first of sip.transports.
    sip: SipConfig = field(default_factory=lambda: SipConfig(port=0, tls_port=0))
    media: AgentMediaConfig = field(default_factory=AgentMediaConfig)
    rudp: RudpConfig = field(default_factory=lambda: AGENT_RUDP)
    reconnect: ReconnectConfig = field(default_factory=ReconnectConfig)
    ip_monitor: IpMonitorConfig = field(default_factory=IpMonitorConfig)
    churnlog: ChurnLogConfig = field(default_factory=ChurnLogConfig)
    sms: AgentSmsConfig = field(default_factory=AgentSmsConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    calendar: AgentCalendarConfig = field(default_factory=AgentCalendarConfig)
    pub_timeout: float = 1.0  # seconds `mdeci pub` waits for pub-ok before "sent"

    def __post_init__(self) -> None:
        _check(bool(SIP_AOR.fullmatch(self.aor)), f"'aor' {self.aor!r} is not sip:user@domain")
        _check(self.pub_timeout > 0, "'pub_timeout' must be > 0")
        _check(bool(self.password), "'password' must not be empty")
        _check(bool(self.node), "'node' must not be empty")
        if self.msisdn is not None:
            _check(bool(E164.fullmatch(self.msisdn)), f"'msisdn' {self.msisdn!r} is not E.164")


def load_agent_config(
    path: str | os.PathLike[str], env: typing.Mapping[str, str] | None = None
) -> AgentConfig:
    """Read and validate an agent TOML file; ``env`` defaults to ``os.environ``.

    Raises :class:`ConfigError` as :func:`load_broker_config` does; ``aor`` and one of
    ``password`` / ``password_env`` are required.
    """
    file = Path(path)
    source = str(path)
    reader = _Reader(source, file.resolve().parent, os.environ if env is None else env)
    cfg = reader.build(AgentConfig, _read_toml(file, source), "")
    state_dir = _in(reader.folder, cfg.state_dir)
    return dataclasses.replace(
        cfg,
        state_dir=state_dir,
        api_socket=_in(state_dir, cfg.api_socket),
        churnlog=dataclasses.replace(cfg.churnlog, path=_in(state_dir, cfg.churnlog.path)),
    )
