"""Configuration of the broker core: ``[queue]`` and ``[subscriptions]`` of the broker TOML.

Defined once in :mod:`mdeci.config` (the TOML schema) and re-exported here, where the
core has always found it.
"""

from __future__ import annotations

from mdeci.config import BrokerCoreConfig, QueueConfig, SubscriptionConfig

__all__ = ["BrokerCoreConfig", "QueueConfig", "SubscriptionConfig"]
