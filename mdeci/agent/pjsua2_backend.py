"""The pjsua2 SIP backend (placeholder until it lands: refuses clearly)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mdeci.agent.core import Address, SipCommand, SipOutcome
from mdeci.agent.errors import AgentError
from mdeci.config import AgentConfig


class Pjsua2Backend:
    name = "pjsua2"

    def __init__(self, config: AgentConfig, random_bytes: Callable[[int], bytes]) -> None:
        self.config = config
        self.transport = config.sip.transports[0]

    @property
    def received(self) -> Mapping[str, int]:
        return {}

    @property
    def contact(self) -> str:
        return ""

    async def start(self, on_bye: Callable[[str], None]) -> Address:
        raise AgentError('[sip] stack = "pjsua2" is not available yet')

    async def execute(self, command: SipCommand, *, timeout: float | None = None) -> SipOutcome:
        return SipOutcome(status=None, reason="pjsua2 backend not started")

    async def close(self) -> None:
        return None
