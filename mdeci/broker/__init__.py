"""The broker core: frames in, durable queues, ordered delivery over RUDP.

SIP-agnostic: the SIP layer calls :meth:`BrokerService.connected` when an INVITE or
re-INVITE completes and :meth:`BrokerService.disconnected` on BYE. See ``docs/broker.md``.
"""

from __future__ import annotations

from mdeci.broker.config import BrokerCoreConfig
from mdeci.broker.delivery import QueueListener
from mdeci.broker.errors import BrokerError, SessionKeyError
from mdeci.broker.glue import Broker
from mdeci.broker.matcher import CompiledSubscription, MatchResult, SubscriptionMatcher
from mdeci.broker.service import BrokerService
from mdeci.broker.sink import ChurnEvent, ChurnLogSink, ChurnSink, MemorySink, NullSink

__all__ = [
    "Broker",
    "BrokerCoreConfig",
    "BrokerError",
    "BrokerService",
    "ChurnEvent",
    "ChurnLogSink",
    "ChurnSink",
    "CompiledSubscription",
    "MatchResult",
    "MemorySink",
    "NullSink",
    "QueueListener",
    "SessionKeyError",
    "SubscriptionMatcher",
]
