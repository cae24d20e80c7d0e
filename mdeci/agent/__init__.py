"""The device agent (``mdeci agent``): SIP session, RUDP frames, durable state, local API.

See ``docs/agent.md``. The names below are imported on first use (PEP 562), so that a
client command importing one light module (``mdeci.agent.api``'s client, the errors) does
not pay for the whole daemon.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mdeci.agent.aio import Agent
    from mdeci.agent.api import ApiClient, ApiServer
    from mdeci.agent.backoff import Backoff
    from mdeci.agent.core import AgentCore
    from mdeci.agent.daemon import RunningAgent, run_agent
    from mdeci.agent.errors import AgentError, ApiError, BrokerRefused, NotConnected, StateError
    from mdeci.agent.ipmonitor import PollingIpMonitor, RouteMonitor, make_monitor
    from mdeci.agent.machine import State, Status
    from mdeci.agent.routes import RouteFollower, RoutingView
    from mdeci.agent.status import AgentStatus, PubResult

_WHERE = {
    "ApiClient": "api",
    "ApiServer": "api",
    "Backoff": "backoff",
    "Agent": "aio",
    "AgentStatus": "status",
    "PubResult": "status",
    "AgentCore": "core",
    "State": "machine",
    "Status": "machine",
    "RunningAgent": "daemon",
    "run_agent": "daemon",
    "AgentError": "errors",
    "ApiError": "errors",
    "BrokerRefused": "errors",
    "NotConnected": "errors",
    "StateError": "errors",
    "PollingIpMonitor": "ipmonitor",
    "RouteMonitor": "ipmonitor",
    "make_monitor": "ipmonitor",
    "RouteFollower": "routes",
    "RoutingView": "routes",
}

__all__ = [
    "Agent",
    "AgentCore",
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
    "RouteFollower",
    "RouteMonitor",
    "RoutingView",
    "RunningAgent",
    "State",
    "StateError",
    "Status",
    "make_monitor",
    "run_agent",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'mdeci.agent' has no attribute {name!r}")
    return getattr(import_module(f"mdeci.agent.{module}"), name)
