"""SMPP 3.4 gateway: an ESME bound as transceiver with smpplib.

MT: ``submit_sm`` with ``esm_class`` UDHI (0x40) when the SMS has a UDH and
``data_coding`` 0x04 (8-bit binary), ``short_message`` = UDH + body. MO: ``deliver_sm``
PDUs (delivery receipts, ``esm_class`` 0x04, are ignored), split back into UDH and body
by the UDHI flag and the UDHL octet. smpplib is blocking: one thread reads
(``client.listen``); submits run in the default executor under a lock; received SMS are
handed to the event loop with ``call_soon_threadsafe``.

Tested: the PDU mapping (tests/sms/test_smpp.py). Not tested here: a bind against a real
SMSC or simulator (none on the development machines); see docs/sms.md.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import smpplib.client
import smpplib.consts
import smpplib.exceptions

from mdeci.sms.codec import Sms
from mdeci.sms.errors import GatewayError, PduError
from mdeci.sms.gateway import SmsHandler

UDHI = 0x40
DELIVERY_RECEIPT = 0x04
BINARY = 0x04


@dataclass(frozen=True, kw_only=True, slots=True)
class SmppConfig:
    host: str = "127.0.0.1"
    port: int = 2775
    system_id: str = "mdeci"
    password: str = ""
    system_type: str = ""
    timeout: float = 10.0  # socket timeout; an idle link sends enquire_link on expiry


def submit_arguments(sms: Sms) -> dict[str, Any]:
    """Keyword arguments of ``Client.send_message`` (``submit_sm``) for ``sms``."""
    return {
        "source_addr_ton": smpplib.consts.SMPP_TON_INTL,
        "source_addr_npi": smpplib.consts.SMPP_NPI_ISDN,
        "source_addr": sms.sender.lstrip("+"),
        "dest_addr_ton": smpplib.consts.SMPP_TON_INTL,
        "dest_addr_npi": smpplib.consts.SMPP_NPI_ISDN,
        "destination_addr": sms.recipient.lstrip("+"),
        "esm_class": UDHI if sms.udh else 0,
        "data_coding": BINARY,
        "short_message": sms.udh + sms.body,
        "registered_delivery": 0,
    }


def _number(value: bytes | str, ton: int) -> str:
    text = value.decode("ascii") if isinstance(value, bytes) else value
    return f"+{text}" if ton == smpplib.consts.SMPP_TON_INTL and text[:1] != "+" else text


def sms_from_deliver(
    *,
    source_addr: bytes | str,
    source_addr_ton: int,
    destination_addr: bytes | str,
    dest_addr_ton: int,
    esm_class: int,
    short_message: bytes,
) -> Sms:
    """The SMS in a ``deliver_sm``; raises :class:`PduError` for a bad UDH length."""
    udh, body = b"", short_message
    if esm_class & UDHI:
        if not short_message or short_message[0] + 1 > len(short_message):
            raise PduError("UDHI set but the UDH does not fit")
        cut = short_message[0] + 1
        udh, body = short_message[:cut], short_message[cut:]
    return Sms(
        _number(source_addr, source_addr_ton), _number(destination_addr, dest_addr_ton), udh, body
    )


def sms_from_pdu(pdu: Any) -> Sms:
    """The SMS in an smpplib ``deliver_sm`` or ``submit_sm`` PDU (the two carry it in the
    same fields); raises :class:`PduError` for a bad UDH length."""
    return sms_from_deliver(
        source_addr=pdu.source_addr,
        source_addr_ton=pdu.source_addr_ton,
        destination_addr=pdu.destination_addr,
        dest_addr_ton=pdu.dest_addr_ton,
        esm_class=pdu.esm_class,
        short_message=pdu.short_message or b"",
    )


class SmppGateway:
    """An ESME (transceiver) speaking to an SMSC with smpplib."""

    def __init__(self, config: SmppConfig) -> None:
        self.config = config
        self._client: smpplib.client.Client | None = None
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.rejected = 0

    async def start(self, on_sms: SmsHandler) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        client = smpplib.client.Client(
            cfg.host, cfg.port, timeout=cfg.timeout, allow_unknown_opt_params=True
        )

        def received(pdu: Any, **_: Any) -> None:
            if pdu.esm_class & DELIVERY_RECEIPT:
                return
            try:
                sms = sms_from_pdu(pdu)
            except PduError:
                self.rejected += 1
                return
            loop.call_soon_threadsafe(on_sms, sms)

        client.set_message_received_handler(received)
        client.set_message_sent_handler(lambda pdu, **_: None)

        def bind() -> None:
            client.connect()
            client.bind_transceiver(
                system_id=cfg.system_id, password=cfg.password, system_type=cfg.system_type
            )

        try:
            await asyncio.to_thread(bind)
        except (OSError, smpplib.exceptions.PDUError, smpplib.exceptions.ConnectionError) as exc:
            raise GatewayError(f"SMPP bind to {cfg.host}:{cfg.port} failed: {exc}") from exc
        self._client = client
        self._reader = threading.Thread(target=self._listen, name="smpp-reader", daemon=True)
        self._reader.start()

    def _listen(self) -> None:
        client = self._client
        if client is None:
            return
        try:
            client.listen()
        except (OSError, smpplib.exceptions.ConnectionError, smpplib.exceptions.PDUError):
            return  # closed or broken: send() reports it
        except AttributeError:
            # smpplib's disconnect() sets its socket to None under a reader blocked in
            # recv(): after our close() that is the end of the stream, nothing more.
            if self._client is not None:
                raise

    async def send(self, sms: Sms) -> None:
        client = self._client
        if client is None:
            raise GatewayError("SMPP gateway not started")

        def submit() -> None:
            with self._lock:
                client.send_message(**submit_arguments(sms))

        try:
            await asyncio.to_thread(submit)
        except (OSError, smpplib.exceptions.PDUError, smpplib.exceptions.ConnectionError) as exc:
            raise GatewayError(f"submit_sm failed: {exc}") from exc

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return

        def stop() -> None:
            try:
                with self._lock:
                    client.unbind()
            except (OSError, smpplib.exceptions.PDUError, smpplib.exceptions.ConnectionError):
                pass
            client.disconnect()

        await asyncio.to_thread(stop)
