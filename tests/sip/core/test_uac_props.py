"""Properties of the UAC core (sip/uac.py), after h2's state-machine tests.

1. The INVITE client's table (state x input -> state, output) is walked exhaustively:
   every input in every state gives the table's state and output, and hypothesis runs
   random input sequences against it.
2. Registration: any sequence of REGISTERs (two registrars, any Expires, answers that
   accept with any interval, challenge or refuse) on a fake clock keeps one Call-ID per
   registration with strictly rising CSeq numbers (retries included), a refresh time
   between half the granted interval and the interval, and leaves the registration
   untouched when refused, gone when removed.
3. The dialog table keeps exactly one record per dialog, and knows which of them
   re-send a 2xx, under any sequence of stores, removals and retransmitters.
"""

from __future__ import annotations

import enum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sip.dialog import Dialog, TwoXxRetransmitter
from sip.headers import Headers
from sip.message import Request, Response, make_response, parse_message, serialize
from sip.timers import TimerConfig
from sip.ua import DialogTable, Reply, Send, UaConfig, UasCore
from sip.uac import DialogCreated, Refused, Registered, Unregistered
from tests.sip.core.test_uac_core import (
    BOB,
    HERE,
    OTHER_REGISTRAR,
    REGISTRAR,
    alice,
    ask,
    registrar,
)


class S(enum.Enum):
    """One INVITE of ours and the dialog its 2xx makes."""

    CALLING = "calling"  # no final response yet
    REFUSED = "refused"
    CONFIRMED = "confirmed"  # 2xx received and ACKed
    ENDED = "ended"  # dialog forgotten (BYE)


class I(enum.Enum):  # noqa: E742
    FINAL_2XX = "final 2xx"  # the transaction's final response
    FINAL_NON_2XX = "final non-2xx"
    RETRANSMITTED_2XX = "2xx again"  # outside the transaction (§13.2.2.4)
    FORKED_2XX = "2xx, other To tag"
    FORGET = "dialog ends"


class Out(enum.Enum):
    ACK = "ack"  # a new ACK
    SAME_ACK = "same ack"  # the first ACK's bytes again
    REFUSED = "refused"
    NOTHING = "nothing"


# The transaction hands the UAC core one final response: FINAL_* only while CALLING.
INVITE_CLIENT_TABLE: dict[tuple[S, I], tuple[S, Out]] = {
    (S.CALLING, I.FINAL_2XX): (S.CONFIRMED, Out.ACK),
    (S.CALLING, I.FINAL_NON_2XX): (S.REFUSED, Out.REFUSED),
    (S.CALLING, I.RETRANSMITTED_2XX): (S.CALLING, Out.NOTHING),
    (S.CALLING, I.FORKED_2XX): (S.CALLING, Out.NOTHING),
    (S.CALLING, I.FORGET): (S.CALLING, Out.NOTHING),
    (S.REFUSED, I.RETRANSMITTED_2XX): (S.REFUSED, Out.NOTHING),
    (S.REFUSED, I.FORKED_2XX): (S.REFUSED, Out.NOTHING),
    (S.REFUSED, I.FORGET): (S.REFUSED, Out.NOTHING),
    (S.CONFIRMED, I.RETRANSMITTED_2XX): (S.CONFIRMED, Out.SAME_ACK),
    (S.CONFIRMED, I.FORKED_2XX): (S.CONFIRMED, Out.NOTHING),
    (S.CONFIRMED, I.FORGET): (S.ENDED, Out.NOTHING),
    (S.ENDED, I.RETRANSMITTED_2XX): (S.ENDED, Out.NOTHING),
    (S.ENDED, I.FORKED_2XX): (S.ENDED, Out.NOTHING),
    (S.ENDED, I.FORGET): (S.ENDED, Out.NOTHING),
}


def answer(invite: Request, status: int, tag: str) -> Response:
    got = parse_message(serialize(invite))
    assert isinstance(got, Request)
    bob = UasCore(UaConfig(aor="sip:bob@example.org"))
    response = bob.build_response(got, Reply(status), tag=tag, contact=f"<sip:bob@{BOB[0]}>")
    parsed = parse_message(serialize(response))
    assert isinstance(parsed, Response)
    return parsed


class InviteClient:
    """Drives one INVITE through the core; observes its state from the core alone."""

    def __init__(self) -> None:
        self.core = alice()
        self.invite = self.core.build_request(
            "INVITE", "sip:bob@example.org", to="<sip:bob@example.org>", body=b"v=0\r\n"
        )
        self.ok = answer(self.invite, 200, "b1")
        self.forked = answer(self.invite, 200, "b2")
        self.refused = False
        self.ended = False
        self.first_ack: bytes | None = None
        self.dialog: Dialog | None = None

    def state(self) -> S:
        if self.refused:
            return S.REFUSED
        if self.dialog is None:
            return S.CALLING
        held = self.core.dialogs.get(self.dialog.id) is self.dialog
        assert held != self.ended
        return S.ENDED if self.ended else S.CONFIRMED

    def feed(self, what: I) -> Out:
        if what is I.FINAL_2XX:
            result = self.core.invite_answered(self.invite, self.ok, "udp")
            assert isinstance(result, DialogCreated)
            self.dialog, self.first_ack = result.dialog, result.ack.wire
            return Out.ACK
        if what is I.FINAL_NON_2XX:
            result2 = self.core.invite_answered(self.invite, answer(self.invite, 486, "b1"), "udp")
            assert isinstance(result2, Refused)
            self.refused = True
            return Out.REFUSED
        if what is I.FORGET:
            if self.dialog is not None:
                self.core.dialogs.pop(self.dialog.id, None)
                self.ended = True
            return Out.NOTHING
        send = self.core.reack(self.ok if what is I.RETRANSMITTED_2XX else self.forked)
        if send is None:
            return Out.NOTHING
        assert send.wire == self.first_ack
        return Out.SAME_ACK


def reach(state: S) -> InviteClient:
    client = InviteClient()
    path = {
        S.CALLING: [],
        S.REFUSED: [I.FINAL_NON_2XX],
        S.CONFIRMED: [I.FINAL_2XX],
        S.ENDED: [I.FINAL_2XX, I.FORGET],
    }[state]
    for step in path:
        client.feed(step)
    assert client.state() is state
    return client


@pytest.mark.parametrize(("state", "what"), sorted(INVITE_CLIENT_TABLE, key=str))
def test_invite_client_table_state(state: S, what: I) -> None:
    client = reach(state)
    client.feed(what)
    assert client.state() is INVITE_CLIENT_TABLE[(state, what)][0]


@pytest.mark.parametrize(("state", "what"), sorted(INVITE_CLIENT_TABLE, key=str))
def test_invite_client_table_output(state: S, what: I) -> None:
    client = reach(state)
    assert client.feed(what) is INVITE_CLIENT_TABLE[(state, what)][1]


def test_invite_client_table_covers_every_state_and_input() -> None:
    finals = {I.FINAL_2XX, I.FINAL_NON_2XX}
    for state in S:
        for what in I:
            applicable = state is S.CALLING or what not in finals
            assert ((state, what) in INVITE_CLIENT_TABLE) == applicable


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list(I)), max_size=12))
def test_invite_client_follows_its_table_for_any_input_sequence(inputs: list[I]) -> None:
    client = InviteClient()
    acks: set[bytes] = set()
    for what in inputs:
        state = client.state()
        if (state, what) not in INVITE_CLIENT_TABLE:
            continue  # a second final response never reaches the core
        expected_state, expected_out = INVITE_CLIENT_TABLE[(state, what)]
        assert client.feed(what) is expected_out
        assert client.state() is expected_state
        if client.first_ack is not None:
            acks.add(client.first_ack)
    assert len(acks) <= 1  # one ACK per 2xx, whatever is retransmitted


# ---------------------------------------------------------------- registration

answers = st.one_of(
    st.tuples(st.just("accept"), st.integers(min_value=1, max_value=7200)),
    st.tuples(st.just("challenge"), st.integers(min_value=1, max_value=7200)),
    st.tuples(st.just("refuse"), st.sampled_from([403, 423, 500, 503])),
)
steps = st.tuples(
    st.sampled_from([REGISTRAR, OTHER_REGISTRAR]),
    st.sampled_from([0, 60, 600, 3600]),
    answers,
    st.floats(min_value=0, max_value=4000, allow_nan=False),
)


def accepted(request: Request, granted: int) -> Response:
    response = make_response(request, 200, to_tag="r1")
    response.headers.add("Contact", f"<sip:alice@{HERE[0]}:{HERE[1]}>;expires={granted}")
    return response


@settings(max_examples=200, deadline=None)
@given(st.lists(steps, max_size=10))
def test_registration_invariants_for_any_sequence(
    sequence: list[tuple[tuple[str, int], int, tuple[str, int], float]],
) -> None:
    core = alice(password="secret")
    last_cseq: dict[str, int] = {}
    now = 0.0
    for step, (dest, expires, (kind, value), wait) in enumerate(sequence):
        # A registrar with a nonce secret of its own each time: credentials sent ahead
        # from an earlier challenge are stale to it, and it challenges.
        challenger = registrar(auth=True, seed=100 + step)
        now += wait
        before = core.registration
        before_granted = before.granted if before is not None else None
        reg, request = core.register_request(dest, expires, "udp")
        if before is not None and before.registrar == dest:
            assert request.call_id == before.call_id
        sent = [request]
        if kind == "challenge":
            challenge = ask(challenger, request, now)
            retry = core.retry(request, challenge, "udp")
            assert retry is not None
            assert retry.call_id == request.call_id
            assert retry.top_via.branch != request.top_via.branch
            sent.append(retry)
        for message in sent:
            assert message.cseq.seq > last_cseq.get(message.call_id, 0)
            last_cseq[message.call_id] = message.cseq.seq
        final = sent[-1]
        if kind == "refuse":
            result = core.register_answered(reg, make_response(final, value), now)
            assert result == Refused(value, make_response(final, value).reason)
            assert core.registration is before
            if before is not None:
                assert before.granted == before_granted
            continue
        result2 = core.register_answered(reg, accepted(final, value), now)
        if expires == 0:
            assert isinstance(result2, Unregistered)
            assert core.registration is None
            continue
        assert isinstance(result2, Registered)
        assert core.registration is reg and reg.registrar == dest
        assert result2.granted == value
        delay = result2.refresh_at - now
        slack = 1e-6  # now + delay - now in floating point
        assert value / 2 - slack <= delay <= value + slack  # half the interval,
        assert delay >= value - 60 - slack  # at most a minute ahead


# ---------------------------------------------------------------- dialog table


def dialog(n: int) -> Dialog:
    headers = Headers()
    headers.add("Via", f"SIP/2.0/UDP 192.0.2.7:5060;branch=z9hG4bK-{n}")
    headers.add("From", f"<sip:a@example.org>;tag=a{n}")
    headers.add("To", "<sip:b@example.org>")
    headers.add("Call-ID", f"call-{n}")
    headers.add("CSeq", "1 INVITE")
    headers.add("Contact", "<sip:a@192.0.2.7>")
    return Dialog.from_uas(Request("INVITE", "sip:b@example.org", headers), f"b{n}")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "store-new", "drop", "retransmit", "acked", "ack", "flow"]),
            st.integers(0, 3),
        )
    )
)
def test_dialog_table_keeps_one_record_per_dialog(ops: list[tuple[str, int]]) -> None:
    """Against a model: what is kept beside each dialog, and a dialog with nothing beside
    it held bare (no record object: a broker holds a dialog per session)."""
    table = DialogTable()
    model: dict[object, Dialog] = {}
    retransmitting: dict[object, TwoXxRetransmitter] = {}
    acks: dict[object, Send] = {}
    flows: dict[object, tuple[str, tuple[str, int]]] = {}
    for op, n in ops:
        key = dialog(n).id
        current = model.get(key)
        if op == "add" and current is None:
            made = dialog(n)
            table.add(made)
            model[made.id] = made
        elif op == "add" and current is not None:
            table[current.id] = current  # the same dialog again keeps what is beside it
        elif op == "store-new":
            made = dialog(n)
            table[made.id] = made
            model[made.id] = made
        elif op == "retransmit":
            retransmitter = TwoXxRetransmitter(
                b"", 0.0, TimerConfig(), lambda _: None, lambda: None
            )
            table.retransmit(key, retransmitter)
            if current is not None:
                retransmitting[key] = retransmitter
        elif op == "acked":
            table.retransmit(key, None)
            retransmitting.pop(key, None)
        elif op == "ack":
            send = Send(b"ACK", ("192.0.2.7", 5060), "udp")
            table.set_ack(key, None if key in acks else send)
            if current is not None and key not in acks:
                acks[key] = send
            else:
                acks.pop(key, None)
        elif op == "flow":
            flow = ("tcp", ("192.0.2.7", 5060 + n))
            table.set_flow(key, None if key in flows else flow)
            if current is not None and key not in flows:
                flows[key] = flow
            else:
                flows.pop(key, None)
        else:
            table.pop(key, None)
            model.pop(key, None)
        if op in ("store-new", "drop"):
            for kept in (retransmitting, acks, flows):
                kept.pop(key, None)  # a new dialog, or none: nothing beside it
        assert dict(table) == model
        assert sorted(map(id, table.retransmitting())) == sorted(map(id, retransmitting.values()))
        for record in table.records():
            held = record.dialog.id
            assert record.dialog is model[held]
            assert record.retransmitter is retransmitting.get(held)
            assert (record.ack, record.flow) == (acks.get(held), flows.get(held))
            bare = held not in retransmitting and held not in acks and held not in flows
            assert (table._records[held] is record.dialog) == bare
        assert len(table.records()) == len(model)
