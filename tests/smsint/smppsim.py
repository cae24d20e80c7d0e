"""A small SMPP 3.4 SMSC for tests (asyncio, smpplib's PDU classes), on loopback.

It answers ``bind_transceiver``, ``enquire_link`` and ``unbind``; a ``submit_sm`` is
answered with ``submit_sm_resp`` and handed to the phone whose number it is addressed to
(:class:`SimPhone`, an :class:`~mdeci.sms.gateway.SmsGateway` for the agent); what a phone
sends goes to the bound ESME as ``deliver_sm``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import smpplib.client
import smpplib.consts
import smpplib.smpp

from mdeci.sms.codec import Sms
from mdeci.sms.gateway import SmsHandler
from mdeci.sms.smpp import BINARY, UDHI, sms_from_pdu


class SmppSim:
    def __init__(self) -> None:
        # smpplib builds and parses PDUs against a client object (sequence numbers).
        self._pdus = smpplib.client.Client("127.0.0.1", 1, allow_unknown_opt_params=True)
        self._server: asyncio.Server | None = None
        self._esme: asyncio.StreamWriter | None = None
        self._phones: dict[str, SmsHandler] = {}
        self.bound = asyncio.Event()
        self.binds: list[str] = []
        self.submitted: list[Sms] = []
        self.delivered: list[Sms] = []
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._esme is not None:
            self._esme.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def attach(self, number: str, on_sms: SmsHandler) -> None:
        """Hand MT SMS for ``number`` to ``on_sms`` (a phone switched on)."""
        self._phones[number] = on_sms

    def detach(self, number: str) -> None:
        """MT SMS for ``number`` go nowhere any more (a phone switched off)."""
        self._phones.pop(number, None)

    def phone(self, number: str) -> SimPhone:
        return SimPhone(self, number)

    def _pdu(self, name: str, **fields: Any) -> bytes:
        pdu = smpplib.smpp.make_pdu(name, client=self._pdus, **fields)
        return bytes(pdu.generate())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readexactly(4)
                body = await reader.readexactly(int.from_bytes(head, "big") - 4)
                pdu = smpplib.smpp.parse_pdu(head + body, client=self._pdus)
                if pdu is None:
                    continue
                seq = pdu.sequence
                if pdu.command == "bind_transceiver":
                    self.binds.append(pdu.system_id.decode())
                    self._esme = writer
                    writer.write(self._pdu("bind_transceiver_resp", sequence=seq, system_id="sim"))
                    self.bound.set()
                elif pdu.command == "submit_sm":
                    sms = sms_from_pdu(pdu)
                    self.submitted.append(sms)
                    msg_id = str(len(self.submitted))
                    writer.write(self._pdu("submit_sm_resp", sequence=seq, message_id=msg_id))
                    handler = self._phones.get(sms.recipient)
                    if handler is not None:
                        asyncio.get_running_loop().call_soon(handler, sms)
                elif pdu.command == "enquire_link":
                    writer.write(self._pdu("enquire_link_resp", sequence=seq))
                elif pdu.command == "unbind":
                    writer.write(self._pdu("unbind_resp", sequence=seq))
                    await writer.drain()
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if self._esme is writer:
                self._esme = None
            writer.close()

    def deliver(self, sms: Sms) -> None:
        """An MO from a phone: ``deliver_sm`` to the bound ESME (dropped if none)."""
        if self._esme is None:
            return
        self.delivered.append(sms)
        self._esme.write(
            self._pdu(
                "deliver_sm",
                sequence=self._pdus.next_sequence(),
                source_addr_ton=smpplib.consts.SMPP_TON_INTL,
                source_addr=sms.sender.lstrip("+"),
                dest_addr_ton=smpplib.consts.SMPP_TON_INTL,
                destination_addr=sms.recipient.lstrip("+"),
                esm_class=UDHI if sms.udh else 0,
                data_coding=BINARY,
                short_message=sms.udh + sms.body,
            )
        )


class SimPhone:
    """A phone number on the simulated SMSC (the agent's gateway)."""

    def __init__(self, sim: SmppSim, number: str) -> None:
        self.sim = sim
        self.number = number

    async def start(self, on_sms: SmsHandler) -> None:
        self.sim.attach(self.number, on_sms)

    async def send(self, sms: Sms) -> None:
        self.sim.deliver(sms)

    async def close(self) -> None:
        self.sim.detach(self.number)
