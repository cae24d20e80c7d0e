"""The broker's sections (``configs/broker.toml``) and their loader."""

from __future__ import annotations

import dataclasses
import os
import socket
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal, get_args

from mdeci.channels.config import ChannelsConfig
from mdeci.config.common import (
    ALLOWED_TRANSPORTS,
    DIGEST_ALGORITHMS,
    E164,
    USER_NAME,
    BrokerMediaConfig,
    ChurnLogConfig,
    HostPort,
    SipConfig,
    SmsGatewayKind,
    _check,
    _port,
    _seconds,
    _whole,
)
from mdeci.config.reader import _in, _read_toml, _Reader, _sqlite_in
from mdeci.errors import ConfigError
from rudp.config import RudpConfig


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
    # SQLite: ``/readyz`` says not ready while the database's filesystem has less free.
    # A nearly full disk still takes a small write (the probe's) and refuses a large
    # publish; the default is room for one frame of the largest size.
    min_free_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        _check("://" in self.url, f"'url' {self.url!r} is not a database URL")
        _whole(self.min_free_bytes, "min_free_bytes", 0)


MIN_DEDUP_HORIZON = 3600.0  # seconds (QueueConfig.dedup_horizon)


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueConfig:
    """``[queue]``: the durable per-URI notification queues (docs/protocol.md §6) and delivery."""

    max_per_uri: int = 1000  # queued notifications per user before the overflow policy
    overflow: OverflowPolicy = OverflowPolicy.DROP_OLDEST
    # Notifications sent to one user and not yet acked by its agent: at most `window` of
    # them and at most `window_bytes` of their frames (always at least one). The count
    # lets a drain of small notifications keep its link busy (with a small window, one
    # agent ack per burst makes each round wait a whole round trip); the bytes bound the
    # memory a user that does not acknowledge holds (docs/security.md), whatever the size
    # of its notifications (a count alone lets 32 frames of 1 MiB hold 32 MiB).
    window: int = 256
    window_bytes: int = 1 << 20
    # Bytes of replies (sub-ok, subs, pub-ok, error...) sent to one user and not yet
    # acknowledged by its RUDP. Past it the user's requests (all but `ack`) are answered
    # `error` 503 instead of being handled, so a user that does not acknowledge cannot
    # grow the broker's memory (docs/security.md). Notifications are bounded by `window`
    # and `window_bytes`.
    max_unacked_reply_bytes: int = 1 << 20
    # How long a (publisher, msg_id) is remembered, seconds: a re-sent publish within it
    # is a duplicate, one older is taken as new. The sweep forgets older ones, so the
    # table does not grow by a row per publish for good. An agent re-sends its outbox
    # after any outage, however long, so this is an outage we accept to publish twice after.
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
    # The filter nodes one user's live subscriptions evaluate per publish, at most
    # (mdeci.broker.matcher.filter_cost); a sub past it is refused (error 403).
    max_filter_cost: int = 1000

    def __post_init__(self) -> None:
        for name in ("default_ttl", "max_ttl", "sweep_interval"):
            _seconds(getattr(self, name), name)
        _whole(self.max_per_user, "max_per_user", 1)
        _whole(self.max_filter_cost, "max_filter_cost", 1)
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

    @property
    def max_filter_cost(self) -> int:
        return self.subscriptions.max_filter_cost


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
class LoginThrottleConfig:
    """``[auth.throttle]``: failed-login locks per source address and per user
    (docs/security.md, "Login throttle"). Times are seconds of the monotonic clock."""

    max_failures: int = 5  # failures within ``window`` that lock the key
    window: float = 60.0
    lockout: float = 30.0  # the first lock; each further lock doubles it
    max_lockout: float = 900.0
    max_keys: int = 10_000  # entries per table (sources, users); live locks are kept
    # Failed-login log lines per ``log_interval``; past it, one summary line per interval.
    log_burst: int = 20
    log_interval: float = 60.0

    def __post_init__(self) -> None:
        _whole(self.max_failures, "max_failures", 1)
        _whole(self.max_keys, "max_keys", 1)
        _whole(self.log_burst, "log_burst", 0)
        for name in ("window", "lockout", "max_lockout", "log_interval"):
            _seconds(getattr(self, name), name)
        _check(self.lockout <= self.max_lockout, "'lockout' must be <= 'max_lockout'")


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
    throttle: LoginThrottleConfig = field(default_factory=LoginThrottleConfig)
    # An answer over UDP to a request without credentials is at most this many times
    # the request's size, else not sent: a spoofed source gains no amplification
    # (docs/security.md). 0 turns the bound off, for clients whose first requests are
    # smaller than a challenge.
    max_answer_ratio: float = 1.0

    def __post_init__(self) -> None:
        _check(self.key_confirm_timeout > 0, "'key_confirm_timeout' must be > 0")
        _check(self.max_answer_ratio >= 0, "'max_answer_ratio' must be >= 0")
        _check(
            bool(self.algorithms) and set(self.algorithms) <= set(DIGEST_ALGORITHMS),
            "'algorithms' must be a non-empty list of 'SHA-256' and 'MD5'",
        )
        names = [u.user for u in self.users]
        dupes = sorted({n for n in names if names.count(n) > 1})
        _check(not dupes, f"user {dupes[0]!r} is defined twice" if dupes else "")


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerSmsConfig:
    """``[sms]``: SMS fallback of urgent notifications while IP is DISCONNECTED.

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

    # This broker's name among several on one database: in its log lines, churn records,
    # `admin sessions` and the sessions it owns (sessions.owner). The host name by default.
    node: str = field(default_factory=socket.gethostname)
    domain: str = "localhost"  # the SIP domain it serves
    user: str = "broker"  # its AOR is sip:<user>@<domain>
    data_dir: Path = Path("var")  # SQLite file, churn log; relative: beside the config file
    admin_socket: Path = Path("admin.sock")  # `mdeci admin` talks here (mode 0600); in data_dir
    sip: SipConfig = field(default_factory=SipConfig)
    media: BrokerMediaConfig = field(default_factory=BrokerMediaConfig)
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


def load_broker_config(
    path: str | os.PathLike[str],
    env: typing.Mapping[str, str] | None = None,
    *,
    secrets: bool = True,
) -> BrokerConfig:
    """Read and validate a broker TOML file; ``env`` defaults to ``os.environ``.

    With ``secrets=False`` no ``password_env`` variable is read (each such password is
    :data:`mdeci.config.reader.UNREAD_SECRET`): for tools that use the store and the
    admin socket but never authenticate a user.

    Raises :class:`ConfigError` with a one-line message naming the file and the key: file
    missing or not TOML, unknown key, wrong type, value out of range, ``password_env``
    unset, users file invalid.
    """
    file = Path(path)
    source = str(path)
    environ = os.environ if env is None else env
    reader = _Reader(source, file.resolve().parent, environ, secrets=secrets)
    cfg = reader.build(BrokerConfig, _read_toml(file, source), "")
    data_dir = _in(reader.folder, cfg.data_dir)
    auth = cfg.auth
    if auth.users_file is not None:
        users = _load_users(auth.users_file, reader.env, secrets=secrets)
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


def _load_users(
    path: Path, env: typing.Mapping[str, str], *, secrets: bool
) -> tuple[UserConfig, ...]:
    reader = _Reader(str(path), path.parent, env, secrets=secrets)
    return reader.build(_UsersFile, _read_toml(path, str(path)), "").users
