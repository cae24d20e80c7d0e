"""Typed configuration of the broker and the agent, loaded once from TOML at start.

Theory of operation
-------------------
Each TOML file maps 1:1 onto frozen, keyword-only dataclasses: top-level keys are the
fields of :class:`BrokerConfig` / :class:`AgentConfig`, and each ``[section]`` is the
nested dataclass of the same name (``[rudp]`` is :class:`rudp.config.RudpConfig` itself).
One generic reader walks the dataclass type hints, so that every key is checked the same
way: unknown keys are refused (``broker.toml: unknown key 'queue.maxx'``), a value of the
wrong type is refused naming its key, and each dataclass validates its ranges in
``__post_init__``. Every field has a documented default except the agent's ``aor`` and
password.

Paths: a relative path written in the file is resolved against the folder of the file.
Paths left at their default live in the node's data folder (``data_dir`` for the broker,
``state_dir`` for the agent), which itself defaults to a folder beside the file. A SQLite
URL with a relative path (``sqlite:///broker.db``) is resolved against ``data_dir``.

One schema: the parts of the broker that take settings read these same dataclasses, so
nothing is translated by hand and each default is written once. The broker core takes
:class:`BrokerCoreConfig` (``[queue]`` and ``[subscriptions]``, via
:attr:`BrokerConfig.core`); the RUDP layer takes ``[rudp]`` (:class:`rudp.config.RudpConfig`);
the SIP transaction timers are :attr:`SipConfig.timers`, whose defaults are those of
:class:`sip.timers.TimerConfig`.

Secrets: ``password = "..."`` or ``password_env = "VARIABLE"`` (read here, once); the rest
of the code never reads files or the environment for settings.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from mdeci.channels.config import ChannelsConfig
from mdeci.errors import ConfigError
from rudp.config import RudpConfig
from sip.timers import TimerConfig

T = TypeVar("T")

E164 = re.compile(r"\+[1-9][0-9]{1,14}")
SIP_AOR = re.compile(r"sips?:[^@:;\s]+@[^@;\s]+")
USER_NAME = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=-]+")  # RFC 3261 'user' unreserved set
TRANSPORTS = ("udp", "tcp")
ALLOWED_TRANSPORTS = ("udp", "tcp", "tls")
DIGEST_ALGORITHMS = ("SHA-256", "MD5")
MIB = 1024 * 1024


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _port(value: int, name: str = "port") -> None:
    _check(0 <= value <= 65535, f"'{name}' must be within 0..65535")


# ---------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostPort:
    """A ``host:port`` address (IPv6 in brackets: ``[::1]:5060``); written as one string."""

    host: str
    port: int

    def __post_init__(self) -> None:
        _check(bool(self.host) and not any(c.isspace() for c in self.host), "empty host")
        _check(1 <= self.port <= 65535, f"port {self.port} outside 1..65535")

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """Parse ``host:port`` or ``[v6]:port``; raises :class:`ConfigError`."""
        host, sep, port = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            raise ConfigError(f"address {text!r}: put an IPv6 host in brackets, [::1]:5060")
        if not sep or not port.isdigit():
            raise ConfigError(f"address {text!r} is not host:port")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


_TIMERS = TimerConfig()  # the RFC 3261 defaults, written once in sip.timers
SIP_STACKS = ("mdeci", "pjsua2")


@dataclass(frozen=True, kw_only=True, slots=True)
class SipConfig:
    """``[sip]``: where the SIP endpoint listens, and the RFC 3261 timers (s). The broker
    listens on every one of ``transports``; the agent also sends its REGISTER and INVITE
    over the first one (docs/agent.md "SIP transport")."""

    host: str = "127.0.0.1"
    port: int = 5060  # RFC 3261 §18 default; the agent's default [sip] has port 0
    transports: tuple[str, ...] = TRANSPORTS  # both: a request over 1300 bytes goes by TCP
    t1: float = _TIMERS.t1  # RTT estimate (RFC 3261 §17.1.1.1)
    t2: float = _TIMERS.t2  # maximum retransmit interval for non-INVITE requests and responses
    t4: float = _TIMERS.t4  # maximum time a message stays in the network
    # SIP over TLS (docs/sip.md): a listener on tls_port with this certificate and key
    # (PEM); tls_ca verifies the peers we connect to (default: the system's CAs).
    tls_port: int = 5061
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    stack: str = "mdeci"  # the agent's SIP stack: "mdeci" (sip/) or "pjsua2"

    def __post_init__(self) -> None:
        _port(self.port)
        _port(self.tls_port)
        _check(bool(self.host), "'host' must not be empty")
        _check(self.stack in SIP_STACKS, f"'stack' must be one of {', '.join(SIP_STACKS)}")
        _check(
            bool(self.transports) and set(self.transports) <= set(ALLOWED_TRANSPORTS),
            "'transports' must be a non-empty list of 'udp', 'tcp' and 'tls'",
        )
        _check(
            (self.tls_cert is None) == (self.tls_key is None),
            "'tls_cert' and 'tls_key' go together",
        )
        _check(len(set(self.transports)) == len(self.transports), "'transports' repeats one")
        _check(0 < self.t1 <= self.t2, "need 0 < t1 <= t2")
        _check(self.t4 > 0, "'t4' must be > 0")

    @property
    def timers(self) -> TimerConfig:
        """The transaction timers for :mod:`sip.transaction` (:class:`sip.timers.TimerConfig`)."""
        return TimerConfig(t1=self.t1, t2=self.t2, t4=self.t4)


@dataclass(frozen=True, kw_only=True, slots=True)
class MediaConfig:
    """``[media]``: the RUDP socket announced in SDP (``c=`` and ``m=application`` port)."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port; SDP carries the real one, so nothing needs to know it
    # Broker behind a UDP relay or NAT (issue 14): announce this address in SDP instead of
    # the socket's, and move a connected agent's media path only by RUDP path validation
    # (the source its packets arrive from), never to the address in its SDP.
    advertise: HostPort | None = None

    def __post_init__(self) -> None:
        _port(self.port)
        _check(bool(self.host), "'host' must not be empty")


@dataclass(frozen=True, kw_only=True, slots=True)
class ChurnLogConfig:
    """``[churnlog]``: the churn log file (docs/protocol.md §8) and its size rotation."""

    path: Path = Path("churn.log")  # default: inside data_dir / state_dir
    max_bytes: int = 10 * MIB
    backups: int = 5

    def __post_init__(self) -> None:
        _check(self.max_bytes >= 1, "'max_bytes' must be >= 1")
        _check(self.backups >= 0, "'backups' must be >= 0")


# ---------------------------------------------------------------------------------------
# Broker
# ---------------------------------------------------------------------------------------


class OverflowPolicy(StrEnum):
    """What a full per-URI queue does with one more notification (``[queue] overflow``)."""

    DROP_OLDEST = "drop-oldest"  # make room by dropping the oldest queued one
    REFUSE_NEWEST = "refuse-newest"  # keep the queue; the new one is dropped


# The same values as the store's type (mdeci.store.queues takes these strings); a test
# checks that the two lists agree.
OverflowPolicyName = Literal["drop-oldest", "refuse-newest"]
OVERFLOW_POLICIES: tuple[OverflowPolicyName, ...] = get_args(OverflowPolicyName)


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreConfig:
    """``[store]``: the database (SQLAlchemy URL). SQLite by default, PostgreSQL in production.

    A relative SQLite path is resolved against ``data_dir`` by the loader.
    """

    url: str = "sqlite:///broker.db"

    def __post_init__(self) -> None:
        _check("://" in self.url, f"'url' {self.url!r} is not a database URL")


def _whole(value: object, name: str, low: int) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    _check(ok, f"'{name}' must be >= {low}")


def _seconds(value: object, name: str) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and value > 0  # type: ignore[arg-type,operator]
    _check(ok, f"'{name}' must be > 0 seconds")


MIN_DEDUP_HORIZON = 3600.0  # seconds (QueueConfig.dedup_horizon)


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueConfig:
    """``[queue]``: the durable per-URI notification queues (docs/protocol.md §6) and delivery."""

    max_per_uri: int = 1000  # queued notifications per user before the overflow policy
    overflow: OverflowPolicy = OverflowPolicy.DROP_OLDEST
    # Notifications sent to one user and not yet acked by its agent: at most `window` of
    # them and at most `window_bytes` of their frames (always at least one). The count
    # lets a drain of small notifications keep its link busy (issue 14: at 32, one agent
    # ack per burst made each round of 32 wait a whole round trip); the bytes bound the
    # memory a user that does not acknowledge holds (docs/security.md), whatever the size
    # of its notifications (32 frames of 1 MiB were 32 MiB).
    window: int = 256
    window_bytes: int = 1 << 20
    # Bytes of replies (sub-ok, subs, pub-ok, error...) sent to one user and not yet
    # acknowledged by its RUDP. Past it the user's requests (all but `ack`) are answered
    # `error` 503 instead of being handled, so a user that does not acknowledge cannot
    # grow the broker's memory (docs/security.md). Notifications are bounded by `window`
    # and `window_bytes`.
    max_unacked_reply_bytes: int = 1 << 20
    # How long a (publisher, msg_id) is remembered, seconds: a re-sent publish within it
    # is a duplicate, one older is taken as new. The sweep forgets older ones (the table
    # grew by a row per publish for good). An agent re-sends its outbox after any outage,
    # however long, so this is an outage we accept to publish twice after.
    # At least MIN_DEDUP_HORIZON: shorter, a re-send after an ordinary outage or a slow
    # handover would be queued twice ("nothing handed twice" broken by a setting).
    dedup_horizon: float = 30 * 86400.0

    def __post_init__(self) -> None:
        _whole(self.max_per_uri, "max_per_uri", 1)
        _seconds(self.dedup_horizon, "dedup_horizon")
        _check(
            self.dedup_horizon >= MIN_DEDUP_HORIZON,
            f"'dedup_horizon' must be at least {MIN_DEDUP_HORIZON:.0f} seconds",
        )
        _whole(self.window, "window", 1)
        _whole(self.window_bytes, "window_bytes", 1)
        _whole(self.max_unacked_reply_bytes, "max_unacked_reply_bytes", 1 << 16)
        _check(self.overflow in OVERFLOW_POLICIES, f"'overflow' must be one of {OVERFLOW_POLICIES}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SubscriptionConfig:
    """``[subscriptions]``: TTLs (seconds) and the expiry sweep."""

    default_ttl: float = 3600.0  # for a 'sub' that gives no ttl
    max_ttl: float = 7 * 86400.0  # longer requests are clamped to this (answered in sub-ok)
    sweep_interval: float = 60.0  # period of the subscription TTL sweep
    max_per_user: int = 100  # live subscriptions per user; more are refused (error 403)

    def __post_init__(self) -> None:
        for name in ("default_ttl", "max_ttl", "sweep_interval"):
            _seconds(getattr(self, name), name)
        _whole(self.max_per_user, "max_per_user", 1)
        _check(self.default_ttl <= self.max_ttl, "need 1 <= default_ttl <= max_ttl")


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerCoreConfig:
    """What :class:`mdeci.broker.Broker` and its service take: ``[queue]`` and
    ``[subscriptions]`` of the broker's TOML, as they are (:attr:`BrokerConfig.core`).

    The read-only properties are the names the core reads.
    """

    queue: QueueConfig = field(default_factory=QueueConfig)
    subscriptions: SubscriptionConfig = field(default_factory=SubscriptionConfig)

    @property
    def default_ttl(self) -> float:
        return self.subscriptions.default_ttl

    @property
    def max_ttl(self) -> float:
        return self.subscriptions.max_ttl

    @property
    def sweep_interval(self) -> float:
        return self.subscriptions.sweep_interval

    @property
    def max_queue_depth(self) -> int:
        return self.queue.max_per_uri

    @property
    def overflow_policy(self) -> OverflowPolicyName:
        return self.queue.overflow.value

    @property
    def window(self) -> int:
        return self.queue.window

    @property
    def window_bytes(self) -> int:
        return self.queue.window_bytes

    @property
    def max_unacked_reply_bytes(self) -> int:
        return self.queue.max_unacked_reply_bytes

    @property
    def dedup_horizon(self) -> float:
        return self.queue.dedup_horizon

    @property
    def max_subscriptions(self) -> int:
        return self.subscriptions.max_per_user


@dataclass(frozen=True, kw_only=True, slots=True)
class RegistrarConfig:
    """``[registrar]``: the broker is its domain's registrar, or registers at ``address``."""

    embedded: bool = True
    address: HostPort | None = None  # the external registrar (e.g. Kamailio) when not embedded
    min_expires: int = 60  # embedded: shorter requests get 423 (RFC 3261 §10.3 step 7)
    max_expires: int = 3600  # embedded: longer requests are shortened
    default_expires: int = 600  # embedded: for a REGISTER without Expires (clamped to min/max)
    register_expires: int = 600  # external: what the broker asks for its own binding
    transport: str = "udp"  # external: how the broker REGISTERs there ("udp", "tcp", "tls")

    def __post_init__(self) -> None:
        if not self.embedded:
            _check(self.address is not None, "'address' is required when embedded = false")
        _check(self.transport in ALLOWED_TRANSPORTS, "'transport' must be udp, tcp or tls")
        _check(1 <= self.min_expires <= self.max_expires, "need 1 <= min_expires <= max_expires")
        _check(self.default_expires >= 1, "'default_expires' must be >= 1")
        _check(self.register_expires >= 1, "'register_expires' must be >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class UserConfig:
    """One ``[[auth.users]]`` entry (or one ``[[users]]`` of the users file).

    ``password`` may be given as ``password_env = "VARIABLE"``.
    """

    user: str
    password: str = field(repr=False)
    msisdn: str | None = None  # E.164, for SMS fallback before the device announces one

    def __post_init__(self) -> None:
        _check(bool(USER_NAME.fullmatch(self.user)), f"user {self.user!r} is not a SIP user")
        _check(bool(self.password), f"user {self.user!r} has an empty password")
        if self.msisdn is not None:
            _check(bool(E164.fullmatch(self.msisdn)), f"msisdn {self.msisdn!r} is not E.164")


@dataclass(frozen=True, kw_only=True, slots=True)
class AuthConfig:
    """``[auth]``: digest authentication (RFC 3261 §22, RFC 8760) and the user list.

    After loading, ``users`` holds the inline users followed by those of ``users_file``.
    """

    realm: str = ""  # empty: the broker's domain
    # Offered in this order. SHA-256 only by default: MD5 (RFC 2617) is an explicit
    # opt-in for old clients (docs/security.md).
    algorithms: tuple[str, ...] = ("SHA-256",)
    users_file: Path | None = None  # a TOML file of [[users]] entries
    users: tuple[UserConfig, ...] = ()
    # Seconds after a key agreement within which the agent's first authentic RUDP
    # datagram must arrive; else the session ends as a key mismatch (docs/security.md).
    key_confirm_timeout: float = 10.0

    def __post_init__(self) -> None:
        _check(self.key_confirm_timeout > 0, "'key_confirm_timeout' must be > 0")
        _check(
            bool(self.algorithms) and set(self.algorithms) <= set(DIGEST_ALGORITHMS),
            "'algorithms' must be a non-empty list of 'SHA-256' and 'MD5'",
        )
        names = [u.user for u in self.users]
        dupes = sorted({n for n in names if names.count(n) > 1})
        _check(not dupes, f"user {dupes[0]!r} is defined twice" if dupes else "")


class SmsGatewayKind(StrEnum):
    """Which SMS gateway the broker uses (docs/channels.md, docs/sms.md)."""

    SIMULATED = "simulated"  # the embedded simulated SMSC (tests, demo)
    KANNEL = "kannel"  # smsbox's sendsms out, get-url callback in
    SMPP = "smpp"  # an ESME bound as transceiver (smpplib)


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerSmsConfig:
    """``[sms]``: SMS fallback of urgent notifications while IP is DISCONNECTED (issue 6).

    Off unless ``enabled``. ``number`` is the broker's own MSISDN (the sender of MT).
    The SMS channel's figures feed the selector (docs/protocol.md §7); the limits are per user
    on the SMS channel (``None``: unbounded). Times are seconds.
    """

    enabled: bool = False
    number: str = "+15550000000"
    gateway: SmsGatewayKind = SmsGatewayKind.SIMULATED
    price: float = 0.0015  # money per SMS (a frame costs as many SMS as it has segments)
    energy_mw: float = 600.0  # the thesis' figures for SMS
    latency_ms: float = 10_000.0
    day_messages: int | None = None  # SMS per user per UTC day
    month_messages: int | None = None  # SMS-carried notifications per user per UTC month
    month_money: float | None = None  # money per user per UTC month
    ttl: float = 86_400.0  # from publication; then the notification is undeliverable
    ack_timeout: float = 200.0  # first wait for the agent's (part) ack; doubles (thesis)
    first_part_ack: bool = True  # segment 1 acknowledged before the rest (docs/sms.md)
    ack_timeout_max: float = 4 * 3600.0
    kannel_sendsms_url: str = "http://127.0.0.1:13013/cgi-bin/sendsms"
    kannel_username: str = "mdeci"
    kannel_password: str = field(default="", repr=False)
    kannel_callback: HostPort = HostPort("127.0.0.1", 13080)  # Kannel's get-url target
    smpp_address: HostPort = HostPort("127.0.0.1", 2775)
    smpp_system_id: str = "mdeci"
    smpp_password: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        _check(bool(E164.fullmatch(self.number)), f"'number' {self.number!r} is not E.164")
        for name in ("price", "energy_mw", "latency_ms"):
            _check(getattr(self, name) >= 0, f"'{name}' must be >= 0")
        _check(self.ttl > 0, "'ttl' must be > 0")
        _check(0 < self.ack_timeout <= self.ack_timeout_max, "need 0 < ack_timeout <= max")
        for name in ("day_messages", "month_messages", "month_money"):
            value = getattr(self, name)
            _check(value is None or value >= 0, f"'{name}' must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsConfig:
    """``[metrics]``: the HTTP endpoint with ``/metrics`` (Prometheus), ``/healthz`` and
    ``/readyz`` (docs/operations.md "Metrics and health")."""

    enabled: bool = False
    host: str = "127.0.0.1"  # keep it off public addresses: there is no authentication
    port: int = 9464  # 0: any free port (tests)

    def __post_init__(self) -> None:
        _port(self.port)
        _check(bool(self.host), "'host' must not be empty")


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerConfig:
    """Everything ``mdeci broker`` needs (``configs/broker.toml``)."""

    node: str = "broker"  # instance name in churn logs
    domain: str = "localhost"  # the SIP domain it serves
    user: str = "broker"  # its AOR is sip:<user>@<domain>
    data_dir: Path = Path("var")  # SQLite file, churn log; relative: beside the config file
    admin_socket: Path = Path("admin.sock")  # `mdeci admin` talks here (mode 0600); in data_dir
    sip: SipConfig = field(default_factory=SipConfig)
    media: MediaConfig = field(default_factory=MediaConfig)
    rudp: RudpConfig = field(default_factory=RudpConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    subscriptions: SubscriptionConfig = field(default_factory=SubscriptionConfig)
    churnlog: ChurnLogConfig = field(
        default_factory=lambda: ChurnLogConfig(path=Path("broker-churn.log"))
    )
    registrar: RegistrarConfig = field(default_factory=RegistrarConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    sms: BrokerSmsConfig = field(default_factory=BrokerSmsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    channels: ChannelsConfig = field(default_factory=ChannelsConfig)  # docs/channels.md

    def __post_init__(self) -> None:
        _check(bool(self.node), "'node' must not be empty")
        _check(bool(self.domain) and "@" not in self.domain, "'domain' must be a host name")
        _check(bool(USER_NAME.fullmatch(self.user)), "'user' must be a SIP user name")

    @property
    def aor(self) -> str:
        """The broker's address-of-record, ``sip:<user>@<domain>``."""
        return f"sip:{self.user}@{self.domain}"

    @property
    def realm(self) -> str:
        """The digest realm: ``auth.realm`` or the domain."""
        return self.auth.realm or self.domain

    @property
    def core(self) -> BrokerCoreConfig:
        """The broker core's part: ``[queue]`` and ``[subscriptions]`` as loaded."""
        return BrokerCoreConfig(queue=self.queue, subscriptions=self.subscriptions)


# ---------------------------------------------------------------------------------------
# Agent
# ---------------------------------------------------------------------------------------


class IpMonitorMode(StrEnum):
    """How the agent notices that its address changed."""

    NETLINK = "netlink"  # pyroute2 link, address and route events (Linux)
    POLL = "poll"  # read links, addresses and routes every poll_interval


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
    # The phone's SMS interface (issue 13; docs/sms.md "The device's gateway"): smsbox
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
    media: MediaConfig = field(default_factory=MediaConfig)
    rudp: RudpConfig = field(default_factory=RudpConfig)
    reconnect: ReconnectConfig = field(default_factory=ReconnectConfig)
    ip_monitor: IpMonitorConfig = field(default_factory=IpMonitorConfig)
    churnlog: ChurnLogConfig = field(default_factory=ChurnLogConfig)
    sms: AgentSmsConfig = field(default_factory=AgentSmsConfig)
    pub_timeout: float = 1.0  # seconds `mdeci pub` waits for pub-ok before "sent"

    def __post_init__(self) -> None:
        _check(bool(SIP_AOR.fullmatch(self.aor)), f"'aor' {self.aor!r} is not sip:user@domain")
        _check(self.pub_timeout > 0, "'pub_timeout' must be > 0")
        _check(bool(self.password), "'password' must not be empty")
        _check(bool(self.node), "'node' must not be empty")
        if self.msisdn is not None:
            _check(bool(E164.fullmatch(self.msisdn)), f"'msisdn' {self.msisdn!r} is not E.164")


# ---------------------------------------------------------------------------------------
# The generic reader
# ---------------------------------------------------------------------------------------

_TOML_TYPES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "a table",
}


def _default(f: dataclasses.Field[Any]) -> Any:
    """The value a field takes when its key is left out (None when it has none)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _toml_type(value: object) -> str:
    for kind, name in _TOML_TYPES.items():
        if type(value) is kind:
            return name
    return type(value).__name__  # dates and times


class _Reader:
    def __init__(self, source: str, folder: Path, env: typing.Mapping[str, str]) -> None:
        self.source = source
        self.folder = folder
        self.env = env

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {message}")

    def build(self, cls: type[T], table: dict[str, Any], prefix: str, base: Any = None) -> T:
        """``cls`` from ``table``; a key the table leaves out takes its value from ``base``
        (the field's default in the enclosing dataclass, e.g. the agent's ``[sip]`` has
        port 0) or, without one, the class default."""
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        secret = "password" in names
        for key in table:
            if key not in names and not (secret and key == "password_env"):
                raise self.error(f"unknown key '{prefix}{key}'")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            key = prefix + f.name
            if f.name in table:
                kwargs[f.name] = self.convert(table[f.name], hints[f.name], key, _default(f))
            elif base is not None:
                kwargs[f.name] = getattr(base, f.name)
            if secret and f.name == "password":
                self.secret(table, prefix, kwargs)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required and f.name not in kwargs:
                raise self.error(f"missing key '{key}'")
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            where = f"[{prefix.rstrip('.')}] " if prefix else ""
            raise self.error(f"{where}{exc}") from None
        except ValueError as exc:  # RudpConfig validates with ValueError
            where = f"[{prefix.rstrip('.')}] " if prefix else ""
            raise self.error(f"{where}{exc}") from None

    def secret(self, table: dict[str, Any], prefix: str, kwargs: dict[str, Any]) -> None:
        if "password_env" not in table:
            return
        if "password" in table:
            raise self.error(f"give '{prefix}password' or '{prefix}password_env', not both")
        var = self.convert(table["password_env"], str, prefix + "password_env")
        value = self.env.get(var)
        if not value:
            raise self.error(f"environment variable {var!r} ('{prefix}password_env') is not set")
        kwargs["password"] = value

    def convert(self, value: Any, hint: Any, key: str, default: Any = None) -> Any:
        origin = typing.get_origin(hint)
        if origin is Literal:
            literals = typing.get_args(hint)
            if value not in literals:
                choices = " or ".join(repr(a) for a in literals)
                raise self.error(f"key '{key}' must be {choices}, not {value!r}")
            return value
        if origin in (types.UnionType, typing.Union):
            (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
            return self.convert(value, inner, key, default)
        if origin is tuple:
            item_hint = typing.get_args(hint)[0]
            if not isinstance(value, list):
                raise self.wrong(key, "an array", value)
            return tuple(self.convert(v, item_hint, f"{key}[{i}]") for i, v in enumerate(value))
        if dataclasses.is_dataclass(hint) and hint is not HostPort:
            if not isinstance(value, dict):
                raise self.wrong(key, "a table", value)
            return self.build(hint, value, key + ".", default)  # type: ignore[arg-type]
        if hint is HostPort:
            if not isinstance(value, str):
                raise self.wrong(key, "a 'host:port' string", value)
            try:
                return HostPort.parse(value)
            except ConfigError as exc:
                raise self.error(f"key '{key}': {exc}") from None
        if isinstance(hint, type) and issubclass(hint, Enum):
            allowed = [m.value for m in hint]
            if value not in allowed:
                choices = " or ".join(repr(a) for a in allowed)
                raise self.error(f"key '{key}' must be {choices}, not {value!r}")
            return hint(value)
        if hint is Path:
            if not isinstance(value, str) or not value:
                raise self.wrong(key, "a path string", value)
            return _in(self.folder, Path(value).expanduser())
        if hint is bool:
            if not isinstance(value, bool):
                raise self.wrong(key, "a boolean", value)
            return value
        if hint is int:
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.wrong(key, "an integer", value)
            return value
        if hint is float:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise self.wrong(key, "a number", value)
            return float(value)
        if hint is str:
            if not isinstance(value, str):
                raise self.wrong(key, "a string", value)
            return value
        raise AssertionError(f"config type {hint!r} not handled")  # a programming error

    def wrong(self, key: str, expected: str, value: object) -> ConfigError:
        return self.error(f"key '{key}' must be {expected}, not {_toml_type(value)}")


def _read_toml(path: Path, source: str) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read ({exc.strerror})") from None


def _in(base: Path, path: Path) -> Path:
    """``path`` made absolute against ``base``, with ``..`` folded (symlinks kept)."""
    return Path(os.path.normpath(path if path.is_absolute() else base / path))


def _sqlite_in(data_dir: Path, url: str) -> str:
    scheme, sep, rest = url.partition(":///")
    if not sep or not scheme.startswith("sqlite"):
        return url
    file, q, query = rest.partition("?")
    if not file or file == ":memory:" or Path(file).is_absolute():
        return url
    return f"{scheme}:///{data_dir / file}{q}{query}"


def load_broker_config(
    path: str | os.PathLike[str], env: typing.Mapping[str, str] | None = None
) -> BrokerConfig:
    """Read and validate a broker TOML file; ``env`` defaults to ``os.environ``.

    Raises :class:`ConfigError` with a one-line message naming the file and the key: file
    missing or not TOML, unknown key, wrong type, value out of range, ``password_env``
    unset, users file invalid.
    """
    file = Path(path)
    source = str(path)
    reader = _Reader(source, file.resolve().parent, os.environ if env is None else env)
    cfg = reader.build(BrokerConfig, _read_toml(file, source), "")
    data_dir = _in(reader.folder, cfg.data_dir)
    auth = cfg.auth
    if auth.users_file is not None:
        users = _load_users(auth.users_file, reader.env)
        try:
            auth = dataclasses.replace(auth, users=auth.users + users)
        except ConfigError as exc:
            raise reader.error(f"[auth] {exc}") from None
    return dataclasses.replace(
        cfg,
        data_dir=data_dir,
        store=dataclasses.replace(cfg.store, url=_sqlite_in(data_dir, cfg.store.url)),
        churnlog=dataclasses.replace(cfg.churnlog, path=_in(data_dir, cfg.churnlog.path)),
        admin_socket=_in(data_dir, cfg.admin_socket),
        auth=auth,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _UsersFile:
    users: tuple[UserConfig, ...] = ()


def _load_users(path: Path, env: typing.Mapping[str, str]) -> tuple[UserConfig, ...]:
    reader = _Reader(str(path), path.parent, env)
    return reader.build(_UsersFile, _read_toml(path, str(path)), "").users


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
