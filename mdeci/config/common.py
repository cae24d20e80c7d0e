"""The settings shared by the broker and the agent: addresses, SIP, media, churn log, the
SMS gateway kind, and the checks every section's ``__post_init__`` uses."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from mdeci.errors import ConfigError
from quicdata.connection import QuicDataConfig
from sip.timers import TimerConfig

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
    # Broker behind a UDP relay or NAT: announce this address in SDP instead of
    # the socket's, and move a connected agent's media path only by RUDP path validation
    # (the source its packets arrive from), never to the address in its SDP.
    advertise: HostPort | None = None
    # QUIC (quicdata/connection.py): a PING every quic_keepalive seconds on an open
    # connection, so that quic_idle_timeout seconds without a packet mean the peer is gone.
    quic_idle_timeout: float = 30.0
    quic_keepalive: float = 10.0

    def __post_init__(self) -> None:
        _port(self.port)
        _check(bool(self.host), "'host' must not be empty")
        _check(
            0 < self.quic_keepalive < self.quic_idle_timeout,
            "need 0 < quic_keepalive < quic_idle_timeout",
        )

    @property
    def quic(self) -> QuicDataConfig:
        """The QUIC connections' settings of this table."""
        return QuicDataConfig(idle_timeout=self.quic_idle_timeout, keepalive=self.quic_keepalive)


# The data channels (docs/sip.md): RUDP (UDP/MDECI-RUDP) and QUIC (UDP/MDECI-QUIC).
DATA_CHANNELS = ("rudp", "quic")
AGENT_TRANSPORTS = (*DATA_CHANNELS, "auto")


@dataclass(frozen=True, kw_only=True, slots=True)
class AgentMediaConfig(MediaConfig):
    """The agent's ``[media]``: also the data channel it offers. ``"auto"`` offers both
    lines, QUIC first, and takes the one the broker accepts (RFC 3264 §6)."""

    transport: str = "rudp"

    def __post_init__(self) -> None:
        MediaConfig.__post_init__(self)
        _check(
            self.transport in AGENT_TRANSPORTS,
            f"'transport' must be one of {', '.join(AGENT_TRANSPORTS)}",
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerMediaConfig(MediaConfig):
    """The broker's ``[media]``: also the data channels it accepts, and the UDP port of
    its QUIC server (on ``host``; 0: any free port, SDP carries the real one)."""

    transports: tuple[str, ...] = ("rudp",)
    quic_port: int = 0

    def __post_init__(self) -> None:
        MediaConfig.__post_init__(self)
        _port(self.quic_port)
        _check(
            bool(self.transports) and set(self.transports) <= set(DATA_CHANNELS),
            "'transports' must be a non-empty list of 'rudp' and 'quic'",
        )
        _check(len(set(self.transports)) == len(self.transports), "'transports' repeats one")


@dataclass(frozen=True, kw_only=True, slots=True)
class ChurnLogConfig:
    """``[churnlog]``: the churn log file (docs/protocol.md §8) and its size rotation."""

    path: Path = Path("churn.log")  # default: inside data_dir / state_dir
    max_bytes: int = 10 * MIB
    backups: int = 5

    def __post_init__(self) -> None:
        _check(self.max_bytes >= 1, "'max_bytes' must be >= 1")
        _check(self.backups >= 0, "'backups' must be >= 0")


def _whole(value: object, name: str, low: int) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    _check(ok, f"'{name}' must be >= {low}")


def _seconds(value: object, name: str) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and value > 0  # type: ignore[arg-type,operator]
    _check(ok, f"'{name}' must be > 0 seconds")


class SmsGatewayKind(StrEnum):
    """Which SMS gateway the broker uses (docs/channels.md, docs/sms.md)."""

    SIMULATED = "simulated"  # the embedded simulated SMSC (tests, demo)
    KANNEL = "kannel"  # smsbox's sendsms out, get-url callback in
    SMPP = "smpp"  # an ESME bound as transceiver (smpplib)
