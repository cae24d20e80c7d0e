"""Configuration of the broker core: one frozen, keyword-only dataclass."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mdeci.errors import ConfigError
from mdeci.store.queues import OVERFLOW_POLICIES, OverflowPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerCoreConfig:
    """Every tunable of :class:`mdeci.broker.Broker` and its service; times in seconds.

    Raises :class:`~mdeci.errors.ConfigError` on construction for an invalid value.
    """

    default_ttl: float = 3600.0  # a `sub` without `ttl` lives this long
    max_ttl: float = 7 * 86400.0  # longer TTLs are clamped to this (answered in sub-ok)
    max_queue_depth: int = 10_000  # queued notifications per user before overflow
    overflow_policy: OverflowPolicy = "drop-oldest"  # see docs/storage.md
    window: int = 32  # notifications sent and not yet acked by the agent, per user
    sweep_interval: float = 60.0  # period of the subscription TTL sweep

    def __post_init__(self) -> None:
        for name in ("default_ttl", "max_ttl", "sweep_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"broker: {name} must be a number of seconds")
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"broker: {name} must be a positive finite number")
        if self.default_ttl > self.max_ttl:
            raise ConfigError("broker: default_ttl must not exceed max_ttl")
        for name in ("max_queue_depth", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"broker: {name} must be an integer >= 1")
        if self.overflow_policy not in OVERFLOW_POLICIES:
            raise ConfigError(f"broker: overflow_policy must be one of {OVERFLOW_POLICIES}")
