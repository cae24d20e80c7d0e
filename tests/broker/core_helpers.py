"""Helpers of the broker core's tests: the users and one-line sub, pub and delivery."""

from __future__ import annotations

from typing import Any

from mdeci.broker import Broker
from mdeci.frames import Frame, Notify, Pub, PubOk, Sub, SubOk, decode, encode
from mdeci.store.repo import BrokerStore

ALICE = "sip:alice@example.com"
BOB = "sip:bob@example.com"
CAROL = "sip:carol@example.com"
PUBLISHER = "sip:feed@example.com"


def one(frames: list[Frame]) -> Frame:
    assert len(frames) == 1, frames
    return frames[0]


def subscribe(broker: Broker, uri: str, subject: str, filter: str = "", **kw: Any) -> SubOk:
    reply = one(broker.handle_frame(uri, encode(Sub(req=1, subject=subject, filter=filter, **kw))))
    assert isinstance(reply, SubOk), reply
    return reply


def publish(
    broker: Broker, msg_id: str, subject: str, uri: str = PUBLISHER, **attrs: str | int | float
) -> PubOk:
    frame = Pub(req=7, msg_id=msg_id, subject=subject, attrs=attrs, payload=b"p-" + msg_id.encode())
    reply = one(broker.handle_frame(uri, encode(frame)))
    assert isinstance(reply, PubOk), reply
    return reply


def queued(store: BrokerStore, uri: str) -> list[tuple[int, str, int]]:
    return [(n.nseq, n.msg_id, n.sub_id) for n in store.queues.pending(uri)]


def notifies(broker: Broker, uri: str) -> list[Notify]:
    out = []
    for item in broker.take_batch(uri):
        frame = decode(item.data)
        assert isinstance(frame, Notify) and frame.nseq == item.nseq
        out.append(frame)
    return out
