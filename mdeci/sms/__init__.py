"""SMS transport for mdeci frames: codec, reassembly, acknowledged links, gateways.

See docs/sms.md. The cores (codec, reassembly, link, smsc, dedupe) do no I/O; the
gateways (simulated, Kannel, SMPP) and :class:`~mdeci.sms.gateway.LinkRunner` are the
asyncio side.
"""

from __future__ import annotations

from mdeci.channels.model import Billing, Tariff
from mdeci.sms.codec import Sms, segment_payload, segments_needed
from mdeci.sms.config import SmsConfig
from mdeci.sms.dedupe import NseqGate
from mdeci.sms.errors import FrameTooLarge, GatewayError, NoFreeReference, PduError, SmsError
from mdeci.sms.link import BufferAcknowledged, BufferExpired, FrameReceived, LinkEvent, SmsLink


def sms_tariff(price: float, config: SmsConfig | None = None) -> Tariff:
    """The exact tariff of an SMS channel at ``price`` per SMS: a frame is billed
    :func:`~mdeci.sms.codec.segments_needed` SMS under ``config``."""
    cfg = config or SmsConfig()
    return Tariff(
        price=price,
        billing=Billing.PER_UNIT,
        unit_bytes=segment_payload(cfg.ref16),
        overhead_bytes=cfg.overhead,
    )


__all__ = [
    "BufferAcknowledged",
    "BufferExpired",
    "FrameReceived",
    "FrameTooLarge",
    "GatewayError",
    "LinkEvent",
    "NoFreeReference",
    "NseqGate",
    "PduError",
    "Sms",
    "SmsConfig",
    "SmsError",
    "SmsLink",
    "segments_needed",
    "sms_tariff",
]
