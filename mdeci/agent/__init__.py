"""The device agent (``mdeci agent``): SIP session, RUDP frames, durable state, local API.

See ``docs/agent.md``.
"""

from __future__ import annotations

from mdeci.agent.api import ApiClient, ApiServer
from mdeci.agent.backoff import Backoff
from mdeci.agent.core import Agent, AgentStatus, PubResult, Status
from mdeci.agent.daemon import RunningAgent, run_agent
from mdeci.agent.errors import AgentError, ApiError, BrokerRefused, NotConnected, StateError
from mdeci.agent.ipmonitor import PollingIpMonitor, make_monitor

__all__ = [
    "Agent",
    "AgentError",
    "AgentStatus",
    "ApiClient",
    "ApiError",
    "ApiServer",
    "Backoff",
    "BrokerRefused",
    "NotConnected",
    "PollingIpMonitor",
    "PubResult",
    "RunningAgent",
    "StateError",
    "Status",
    "make_monitor",
    "run_agent",
]
