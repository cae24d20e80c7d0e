"""SMPP mapping: submit_sm arguments and deliver_sm back to an SMS (no SMSC needed)."""

from __future__ import annotations

import pytest
import smpplib.client
import smpplib.smpp

from mdeci.sms.codec import Sms, encode_frame
from mdeci.sms.errors import GatewayError, PduError
from mdeci.sms.smpp import SmppConfig, SmppGateway, sms_from_deliver, submit_arguments


def test_submit_then_deliver_round_trip_through_smpplib_pdus() -> None:
    udh, body = encode_frame(b"frame" * 40, ref=9, dst_port=16300, src_port=16300)[0]
    sms = Sms("+15550000001", "+15550000002", udh, body)
    args = submit_arguments(sms)
    assert args["esm_class"] == 0x40 and args["data_coding"] == 0x04
    client = smpplib.client.Client("127.0.0.1", 1, allow_unknown_opt_params=True)
    pdu = smpplib.smpp.make_pdu("submit_sm", client=client, **args)
    back = smpplib.smpp.parse_pdu(pdu.generate(), client=client)
    got = sms_from_deliver(
        source_addr=back.source_addr,
        source_addr_ton=back.source_addr_ton,
        destination_addr=back.destination_addr,
        dest_addr_ton=back.dest_addr_ton,
        esm_class=back.esm_class,
        short_message=back.short_message,
    )
    assert got == sms


def test_plain_and_bad_deliveries() -> None:
    plain = sms_from_deliver(
        source_addr=b"4479",
        source_addr_ton=0,
        destination_addr="1",
        dest_addr_ton=1,
        esm_class=0,
        short_message=b"hello",
    )
    assert plain == Sms("4479", "+1", b"", b"hello")
    with pytest.raises(PduError):
        sms_from_deliver(
            source_addr="1",
            source_addr_ton=1,
            destination_addr="2",
            dest_addr_ton=1,
            esm_class=0x40,
            short_message=b"\x09abc",
        )


async def test_bind_failure_is_a_gateway_error() -> None:
    import socket

    from tests.peers import free_port

    gw = SmppGateway(SmppConfig(port=free_port(socket.SOCK_STREAM), timeout=1.0))
    with pytest.raises(GatewayError):
        await gw.start(lambda sms: None)
    with pytest.raises(GatewayError):
        await gw.send(Sms("+1", "+2", b"", b"x"))
