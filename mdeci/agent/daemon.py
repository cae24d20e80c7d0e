"""An agent with its local API, as ``mdeci agent`` and the demo run it."""

from __future__ import annotations

from typing import Any

from mdeci.agent.aio import Agent
from mdeci.agent.api import ApiServer
from mdeci.agent.status import AgentStatus
from mdeci.config import AgentConfig


class RunningAgent:
    """A started :class:`Agent` serving its API on ``config.api_socket``."""

    def __init__(self, agent: Agent, api: ApiServer) -> None:
        self.agent = agent
        self.api = api

    @property
    def config(self) -> AgentConfig:
        return self.agent.config

    async def move_to(self, host: str) -> None:
        """Move SIP and RUDP to ``host`` (e.g. 127.0.0.2 -> 127.0.0.3)."""
        await self.agent.move_to(host)

    def status(self) -> AgentStatus:
        return self.agent.status()

    async def wait_connected(self) -> None:
        await self.agent.wait_connected()

    async def close(self, *, clean: bool = True) -> None:
        """Stop the API, then the agent (``clean``: BYE and unREGISTER)."""
        await self.api.close()
        await self.agent.close(clean=clean)


async def run_agent(config: AgentConfig, **kwargs: Any) -> RunningAgent:
    """Start an agent and its API (keyword arguments go to :class:`Agent`).

    Returns once the API socket listens; the session comes up in the background.
    Raises :class:`~mdeci.agent.errors.StateError`, :class:`~mdeci.agent.errors.ApiError`
    (another agent owns the socket), :class:`OSError` (binding).
    """
    agent = Agent(config, **kwargs)
    api = ApiServer(agent, config.api_socket)
    try:
        await agent.start()
        await api.start()
    except BaseException:
        await api.close()
        await agent.close(clean=False)
        raise
    return RunningAgent(agent, api)
