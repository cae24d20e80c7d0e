"""The agent's SMS inbox: frames from the broker's number, into the same handling as RUDP.

An :class:`SmsInbox` runs an :class:`~mdeci.sms.link.SmsLink` for the device's MSISDN
over a gateway (the phone's modem in production; the simulated network or Kannel's
fakesmsc in tests). The link reassembles buffers and acknowledges each one to the broker
(the broker then deletes that notification from its queue, docs/channels.md); every
frame from the broker's number goes to ``on_frame``, i.e. the agent's notify handling:
``nseq`` gate, inbox, listeners. Every SMS is sealed with the user's SMS keys
(:func:`sms_auth`, docs/sms.md "Authentication"): SMS from other numbers, forged,
tampered or replayed ones are counted, logged and dropped by the link.

The gate must tolerate reordering (SMS, and urgent notifications overtaking normal ones
still queued for IP): :func:`windowed_gate` rebuilds the agent's persisted gate with a
window (docs/sms.md "Exactly once to the application").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from mdeci.agent.errors import AgentError
from mdeci.config import AgentConfig, AgentSmsConfig
from mdeci.sms.auth import KeyRing, Role, SmsAuth
from mdeci.sms.config import SmsConfig
from mdeci.sms.counterfile import COUNTER_FILE, JsonCounters
from mdeci.sms.dedupe import NseqGate
from mdeci.sms.gateway import LinkRunner, SmsGateway, network_gateway
from mdeci.sms.link import FrameReceived, LinkEvent, SmsLink
from sip.auth import compute_ha1


def open_gateway(config: AgentSmsConfig) -> SmsGateway:
    """The device's SMS gateway that ``[sms] gateway`` names (Kannel smsbox or SMPP).

    Raises :class:`AgentError` for ``"simulated"``: that network reaches no broker (tests
    hand the agent a gateway of their own network).
    """
    gateway = network_gateway(config)
    if gateway is not None:
        return gateway
    raise AgentError(
        '[sms] gateway = "simulated" reaches no broker outside tests: set gateway = '
        '"kannel" or "smpp" (docs/sms.md "The device\'s gateway")'
    )


def link_config(config: AgentSmsConfig) -> SmsConfig:
    """The device's SMS link settings from ``[sms]``."""
    return SmsConfig(
        ack_timeout=config.ack_timeout,
        ack_timeout_max=max(config.ack_timeout, SmsConfig().ack_timeout_max),
        first_part_ack=config.first_part_ack,
        authenticated=True,
    )


def sms_auth(config: AgentConfig) -> SmsAuth:
    """The device's SMS keys (from its SHA-256 HA1) and replay counters (``state_dir``).

    Raises :class:`~mdeci.sms.errors.CounterFileError` for a malformed counter file.
    """
    user = config.aor.split(":", 1)[1].split("@", 1)[0]
    realm = config.broker.realm or config.broker.aor.rsplit("@", 1)[1]
    ring = KeyRing(Role.DEVICE)
    ring.set(config.sms.broker_number, compute_ha1(user, realm, config.password, "SHA-256"))
    return SmsAuth(ring.get, JsonCounters(config.state_dir / COUNTER_FILE), clock=time.time)


def windowed_gate(path: Path, highest: int, window: int) -> NseqGate:
    """The gate persisted at ``path`` (``nseq.json``, read before) with ``window``.

    ``highest`` is the state's current highest (it may include the inbox floor); the
    ``recent`` numbers are read again from the file, since a gate without a window keeps
    none of them.
    """
    recent: list[int] = []
    try:
        data = json.loads(path.read_bytes())
        recent = [int(n) for n in data.get("recent", [])]
    except (OSError, ValueError, TypeError, AttributeError):
        recent = []  # no file yet (or unreadable: NseqState already refused that)
    return NseqGate(highest, window=window, recent=recent)


class SmsInbox:
    """Receives frames from ``broker_number`` at ``number`` through ``gateway``."""

    def __init__(
        self,
        number: str,
        broker_number: str,
        gateway: SmsGateway,
        on_frame: Callable[[bytes], None],
        config: SmsConfig | None = None,
        auth: SmsAuth | None = None,
    ) -> None:
        self.broker_number = broker_number
        self.link = SmsLink(number, config, auth=auth)
        self.runner = LinkRunner(self.link, gateway, self._on_event)
        self._on_frame = on_frame
        self.foreign = 0

    @classmethod
    def for_agent(
        cls, config: AgentConfig, gateway: SmsGateway | None, on_frame: Callable[[bytes], None]
    ) -> SmsInbox:
        """The inbox ``[sms]`` describes, over ``gateway`` or else the one ``[sms] gateway``
        names. Raises :class:`AgentError` without ``msisdn`` (this device's number)."""
        if config.msisdn is None:
            raise AgentError("[sms] enabled needs msisdn (this device's number)")
        if gateway is None:
            gateway = open_gateway(config.sms)
        return cls(
            config.msisdn, config.sms.broker_number, gateway, on_frame,
            link_config(config.sms), sms_auth(config),
        )  # fmt: skip

    async def start(self) -> None:
        await self.runner.start()

    async def close(self) -> None:
        await self.runner.close()

    def send_frame(self, frame: bytes) -> int:
        """Send a frame to the broker by SMS (MO); returns the link's buffer id."""
        return self.runner.send_frame(self.broker_number, frame)

    def _on_event(self, event: LinkEvent) -> None:
        if not isinstance(event, FrameReceived):
            return  # acks of our own MO buffers: nothing to do
        if event.sender != self.broker_number:
            self.foreign += 1
            return
        self._on_frame(event.frame)
