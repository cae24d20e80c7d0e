"""The agent core's answer to a restarted broker: sans-IO, a part of :class:`AgentCore`.

How a dead broker is noticed is RUDP's (``dead_after`` and the keepalive, whose agent
defaults are :data:`mdeci.config.agent.AGENT_RUDP`): the link reports a lost peer and
the core goes DISCONNECTED, logging ``broker_lost`` (the churn log's fact of a broker
gone silent: a killed broker logs nothing, so the analytics count the outage from the
agent's line). This module also decides what happens when the broker comes back before
our own attempts reach it.

A broker that restarts reads every session stored CONNECTED back, with its key, and its
new RUDP association under that key speaks first (docs/protocol.md "Broker restart").
Our association with its previous incarnation refuses those datagrams (another sender),
and, once it has given that incarnation up, reports them (``PeerRestarted``). Then
:meth:`BrokerLiveness.broker_restarted` starts a new association under the same key at
once and probes it (a ``list``): the probe's answer makes us CONNECTED, as after an
INVITE, without waiting for a SIP transaction that may be backing off towards the dead
process. A replayed datagram of an older incarnation makes a probe nobody answers: the
probe's timeout then fails the attempt as any unanswered probe does.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from mdeci.agent.events import AttachMedia, ChurnRecord, Command, Sink, hostport
from mdeci.agent.machine import State
from mdeci.agent.offer import SessionKeys
from mdeci.agent.requests import Requests
from mdeci.churnlog import Event
from mdeci.frames import List

Address = tuple[str, int]


class BrokerLiveness:
    """The restart half of :class:`~mdeci.agent.core.AgentCore` (its fields, declared
    here for the type checker)."""

    state: State
    call_id: str | None
    broker_media: Address | None
    media_addr: Address
    retry_at: float | None
    _connected: bool
    _keys: SessionKeys
    _requests: Requests
    _commands: deque[Command]
    sink: Sink

    if TYPE_CHECKING:

        def _lose(self, now: float, reason: str) -> None: ...

    def _lost_broker(self, now: float, reason: str) -> None:
        """RUDP gave the broker up (no answer within its bound): DISCONNECTED, and, when
        we were CONNECTED, a ``broker_lost`` line."""
        if self._connected:
            # addr: ours, as on the broker's media_disconnected (the analytics' networks
            # table counts where a disconnection began).
            fields = {"call_id": self.call_id, "addr": hostport(self.media_addr), "reason": reason}
            self.sink(ChurnRecord(Event.BROKER_LOST, fields))
        self._lose(now, reason)

    def broker_restarted(self, now: float) -> bool:
        """A new incarnation of the broker spoke under our session key while we held it
        for dead: probe a new association with it now. True when a probe went out."""
        key = self._keys.key
        if (
            self._connected
            or key is None
            or self.call_id is None
            or self.broker_media is None
            or self.state in (State.CLOSING, State.CLOSED)
        ):
            return False
        # The back-off's timer would start a SIP attempt the probe makes useless; a probe
        # without an answer fails the attempt and sets it again.
        self.retry_at = None
        self._commands.append(AttachMedia(key, self.broker_media, fresh=True))
        self._requests.request(now, List(req=self._requests.next_req()), probe=True)
        return True
