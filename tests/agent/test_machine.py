"""The agent core's transition table (after h2's ``test_state_machines.py``).

1. Every (state, trigger) pair either has the table's entry or is refused with
   :class:`TransitionError`.
2. Hypothesis: any sequence of the core's inputs (SIP outcomes of every kind, answers
   to the probe, notifications, lost peers, BYEs, moves, timers, requests, closing,
   failing state files) changes the state only along the table, keeps one SIP command
   at a time, keeps the status consistent with the state, and after CLOSED changes
   nothing.
3. A seeded walk of the same inputs, with a named sequence for each of the deepest,
   takes every transition of the table that changes the state.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.agent.core import AgentCore
from mdeci.agent.errors import NotConnected, StateError, TransitionError
from mdeci.agent.events import (
    Bye,
    CoreEvent,
    Invite,
    MoveSip,
    Register,
    Reinvite,
    SendFrame,
    SipCommand,
    SipOutcome,
    StateChanged,
)
from mdeci.agent.machine import TRANSITIONS, State, Status, Trigger, next_state
from mdeci.frames import Error, List, Notify, Pub, PubOk, Sub, SubOk, Subs, decode, encode
from rudp.keys import KeyExchange
from sip.sdp import build_answer
from tests.agent.memfiles import MemoryFiles
from tests.agent.test_core import BROKER_MEDIA, MEDIA, SIP, T0, Counter, config

S = State


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("trigger", list(Trigger))
def test_every_state_and_trigger_is_in_the_table_or_refused(state: State, trigger: Trigger) -> None:
    if (state, trigger) in TRANSITIONS:
        assert next_state(state, trigger) is TRANSITIONS[(state, trigger)]
    else:
        with pytest.raises(TransitionError):
            next_state(state, trigger)


def test_only_closing_leads_to_closed_and_closed_is_final() -> None:
    assert {s for (s, _), t in TRANSITIONS.items() if t is S.CLOSED} == {S.CLOSING}
    assert not [key for key in TRANSITIONS if key[0] is S.CLOSED]
    assert not [key for key, t in TRANSITIONS.items() if t is S.IDLE]


class Walk:
    """One core on in-memory files, driven by abstract inputs; it records every change."""

    def __init__(self) -> None:
        self.now = T0
        self.events: list[CoreEvent] = []
        self.files = MemoryFiles()
        self.core = AgentCore(
            config(Path("/nonexistent")),
            self.files,
            self.events.append,
            random_bytes=Counter(),
            jitter=lambda: 0.5,
            sip_addr=SIP,
            media_addr=MEDIA,
        )
        self.sip: SipCommand | None = None  # the SIP command the core waits for
        self.requests: list[List | Sub | Pub] = []  # the requests sent
        self.nseq = 0
        self.answers = 0
        self.taken: set[tuple[State, Trigger]] = set()
        self.state = self.core.state
        self.seen = 0

    def pump(self) -> None:
        while (command := self.core.next_command()) is not None:
            if isinstance(command, SendFrame):
                frame = decode(command.data)
                if isinstance(frame, List | Sub | Pub):
                    self.requests.append(frame)
            elif isinstance(command, Register | Invite | Reinvite | MoveSip | Bye):
                assert self.sip is None, "one SIP command at a time"
                self.sip = command
        self.check()

    def check(self) -> None:
        for event in self.events[self.seen :]:
            if isinstance(event, StateChanged) and event.trigger is not None:
                assert TRANSITIONS[(self.state, event.trigger)] is event.state
                self.taken.add((self.state, event.trigger))
                assert self.state is not S.CLOSED
                self.state = event.state
        self.seen = len(self.events)
        core = self.core
        assert core.state is self.state
        if core.state in (S.IDLE, S.PROBING, S.CLOSING, S.CLOSED):
            assert core.status is Status.DISCONNECTED
        if core.state is S.CLOSED:
            assert self.sip is None

    # ------------------------------------------------------------------ inputs

    def answer_sip(self, kind: int) -> None:
        command, self.sip = self.sip, None
        if command is None:
            return
        status: int | None = (200, 200, 200, 200, 200, 200, 401, 408, None, 481, 488, 500)[kind]
        body = b""
        if status == 200 and isinstance(command, Invite | Reinvite):
            body = self.sdp(command.offer, kind)
        outcome = SipOutcome(
            status=status,
            reason="test",
            body=body,
            call_id="call-1",
            local_addr=(command.host, 5070) if isinstance(command, MoveSip) else None,
        )
        self.core.sip_done(self.now, command, outcome)

    def sdp(self, offer: bytes, kind: int) -> bytes:
        self.answers += 1
        if kind == 3:
            return b"not sdp"
        public = KeyExchange(bytes([self.answers % 250 + 1]) * 32).public
        text = build_answer(offer, "broker", 1, 1, *BROKER_MEDIA, key=None if kind == 2 else public)
        store = "store-2" if kind == 1 else "store-1"
        head, sep, rest = text.partition("m=")
        return f"{head}a=mdeci-store:{store}\r\n{sep}{rest}".encode()

    def answer_request(self, kind: int) -> None:
        if not self.requests:
            return
        sent = self.requests.pop(kind % len(self.requests))
        req = sent.req
        if kind % 6 == 5:
            frame: Subs | SubOk | PubOk | Error = Error(req=req, code=500, message="busy")
        elif isinstance(sent, List):
            frame = Subs(req=req)
        elif isinstance(sent, Sub):
            frame = SubOk(req=req, sub_id=f"s{req}", expires_at=self.now + 60)
        else:
            frame = PubOk(req=req, msg_id=sent.msg_id, matched=1)
        self.core.frame_received(self.now, encode(frame))

    def notify(self, kind: int) -> None:
        self.nseq += 1
        frame = Notify(
            nseq=max(1, self.nseq - kind % 2),  # every other one a copy
            sub_id="1",
            subject="news.a",
            msg_id=f"m{self.nseq}",
            published_at=self.now,
            attrs={},
            payload=b"x",
        )
        self.core.frames_received(self.now, [encode(frame)])

    def timer(self, kind: int) -> None:
        when = self.core.get_timer()
        self.now = max(self.now, when) if when is not None else self.now + 1.0
        self.core.handle_timer(self.now)

    def request(self, kind: int) -> None:
        try:
            if kind % 2:
                self.core.subscribe(self.now, "news.a")
            else:
                self.core.publish(self.now, "news.a", payload=b"p")
                self.core.sync_outbox(self.now)
        except (NotConnected, StateError):
            pass

    def close(self, kind: int) -> None:
        if self.core.state not in (S.CLOSING, S.CLOSED):
            self.sip = None  # the core ignores the outcome of what runs still
        self.core.close(self.now, clean=kind % 4 != 0)

    def disk(self, kind: int) -> None:
        self.files.inbox.fail = self.files.outbox.fail = kind % 4 == 0


INPUTS: dict[str, Callable[[Walk, int], None]] = {
    "start": lambda w, k: w.core.start(w.now),
    "sip": Walk.answer_sip,
    "sip2": Walk.answer_sip,
    "request": Walk.answer_request,
    "notify": Walk.notify,
    "peer_lost": lambda w, k: w.core.peer_lost(w.now, "rudp: test"),
    "bye": lambda w, k: w.core.bye_received(w.now),
    "move": lambda w, k: w.core.address_changed(w.now, f"127.0.0.{3 + k % 2}"),
    "bound": lambda w, k: w.core.media_bound(w.now, (f"127.0.0.{3 + k % 2}", 4000)),
    "timer": Walk.timer,
    "app": Walk.request,
    "disk": Walk.disk,
    "close": Walk.close,
}
NAMES = sorted(INPUTS)


def run(walk: Walk, steps: list[tuple[str, int]]) -> None:
    for name, kind in steps:
        INPUTS[name](walk, kind)
        walk.pump()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 11)), max_size=40))
def test_any_input_sequence_moves_along_the_table(steps: list[tuple[str, int]]) -> None:
    run(Walk(), steps)


# Transitions too deep for the random walk, each reached by a sequence of inputs.
DEEP: dict[tuple[State, Trigger], list[tuple[str, int]]] = {
    # A BYE during the probe starts a second session whose probe still pends when the
    # first one connects; it times out during a move's re-INVITE (back-off), and the
    # re-INVITE's answer resumes the live session.
    (S.BACKOFF, Trigger.RESUMED): [
        ("start", 0),
        ("sip", 0),  # REGISTER: 200
        ("sip", 0),  # INVITE: 200, probe 1
        ("bye", 0),
        ("sip", 0),  # INVITE: 200, probe 2
        ("request", 0),  # probe 1 answered: CONNECTED
        ("move", 0),
        ("sip", 0),  # the move's REGISTER: 200, re-INVITE
        ("timer", 0),  # probe 2 times out: BACKOFF
        ("sip", 2),  # re-INVITE: 200 keeping the keys
    ],
    # A failed move unregisters; the next move's re-INVITE probes a session whose BYE
    # then starts with REGISTER.
    (S.PROBING, Trigger.REGISTER): [
        ("start", 0),
        ("sip", 0),  # REGISTER: 200
        ("move", 0),  # waits for the INVITE
        ("sip", 0),  # INVITE: 200, probe; then the move
        ("sip", 9),  # the move's REGISTER: 481, BACKOFF
        ("move", 1),
        ("sip", 0),  # the move's REGISTER: 200, re-INVITE
        ("sip", 2),  # re-INVITE: 200 keeping the keys: PROBING
        ("bye", 0),
    ],
    # The probe's answer comes during a move's re-INVITE, then the peer is lost: the
    # re-INVITE's answer finds the media down and probes again.
    (S.CONNECTED, Trigger.ANSWERED): [
        ("start", 0),
        ("sip", 0),  # REGISTER: 200
        ("sip", 0),  # INVITE: 200, probe
        ("move", 0),
        ("sip", 0),  # the move's REGISTER: 200, re-INVITE
        ("request", 0),  # the probe answered: CONNECTED
        ("peer_lost", 0),
        ("sip", 2),  # re-INVITE: 200 keeping the keys
    ],
    # A BYE during the probe, a refused INVITE, then the probe's answer: a move of the
    # live session without a dialog INVITEs anew, and its answer resumes.
    (S.INVITING, Trigger.RESUMED): [
        ("start", 0),
        ("sip", 0),  # REGISTER: 200
        ("sip", 0),  # INVITE: 200, probe
        ("bye", 0),
        ("sip", 6),  # INVITE: 401, BACKOFF
        ("request", 0),  # the probe answered: CONNECTED
        ("move", 0),
        ("sip", 0),  # the move's REGISTER: 200, no dialog: INVITE
        ("sip", 0),  # INVITE: 200
    ],
    # A failed move unregisters; the back-off's REGISTER runs when the probe's answer
    # comes.
    (S.REGISTERING, Trigger.PROBED): [
        ("start", 0),
        ("sip", 0),  # REGISTER: 200
        ("move", 0),  # waits for the INVITE
        ("sip", 0),  # INVITE: 200, probe; then the move
        ("sip", 10),  # the move's REGISTER: 488, BACKOFF
        ("timer", 0),  # the back-off ends: REGISTER
        ("request", 0),  # the probe answered
    ],
}


@pytest.mark.parametrize("transition", list(DEEP))
def test_deep_transitions_are_reached(transition: tuple[State, Trigger]) -> None:
    walk = Walk()
    run(walk, DEEP[transition])
    assert transition in walk.taken


def test_a_seeded_walk_takes_every_transition_that_changes_the_state() -> None:
    rng = random.Random(29)
    taken: set[tuple[State, Trigger]] = set(DEEP)
    # Weighted towards what moves a session forward, so that deep states are reached.
    weights = {name: 1 for name in NAMES} | {"start": 4, "sip": 6, "sip2": 6, "request": 4}
    names = [n for n in NAMES for _ in range(weights[n])]
    for _ in range(1200):
        walk = Walk()
        run(walk, [(rng.choice(names), rng.randrange(12)) for _ in range(40)])
        taken |= walk.taken
    changing = {key for key, target in TRANSITIONS.items() if key[0] is not target}
    assert sorted(changing - taken) == []
