"""Configuration of an SMS link (one frozen, keyword-only dataclass)."""

from __future__ import annotations

from dataclasses import dataclass

from mdeci.sms.auth import OVERHEAD
from mdeci.sms.codec import tag_length
from mdeci.sms.errors import SmsError


@dataclass(frozen=True, kw_only=True, slots=True)
class SmsConfig:
    """Tunables of :class:`mdeci.sms.link.SmsLink`; times are seconds (docs/sms.md)."""

    data_port: int = 16300  # TS 23.040 §9.2.3.24.4: 16000-16999 free for applications
    ack_port: int = 16301
    ref16: bool = False  # 16-bit concatenation references (one octet less per segment)
    key: bytes | None = None  # shared key: HMAC-SHA256/8 tags instead of CRC-32
    # Sealed buffers and acks (mdeci.sms.auth): the link then needs an SmsAuth, and
    # ``key`` is unused.
    authenticated: bool = False
    # First wait for a buffer's (or its first part's) ack; doubles on each expiry. 200 s:
    # the thesis' choice over its SMSC delay trace (docs/benchmarks.md "SMS link timers").
    ack_timeout: float = 200.0
    first_part_ack: bool = True  # segment 1 acknowledged before the rest is sent
    ack_timeout_max: float = 4 * 3600.0  # the doubling stops here
    default_ttl: float = 24 * 3600.0  # a buffer not acked by then is undeliverable
    reassembly_timeout: float = 4 * 3600.0  # incomplete buffers are dropped after this
    duplicate_memory: float = 6 * 3600.0  # completed buffers are recognised this long
    max_assemblies: int = 1024
    max_done: int = 4096

    @property
    def overhead(self) -> int:
        """Octets a buffer adds to its frame: the AEAD tag and counter, or the tag."""
        return OVERHEAD if self.authenticated else tag_length(self.key)

    def __post_init__(self) -> None:
        if not (0 <= self.data_port < 65536 and 0 <= self.ack_port < 65536):
            raise SmsError("ports must be 0..65535")
        if self.data_port == self.ack_port:
            raise SmsError("data_port and ack_port must differ")
        if not 0 < self.ack_timeout <= self.ack_timeout_max:
            raise SmsError("need 0 < ack_timeout <= ack_timeout_max")
        if self.default_ttl <= 0:
            raise SmsError("default_ttl must be > 0")
