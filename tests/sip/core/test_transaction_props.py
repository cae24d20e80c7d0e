"""Properties of the four transaction machines (after h2's ``test_state_machines.py``).

1. The transition table is the single source of truth: an exhaustive walk of
   every machine (UDP and reliable) feeds every abstract input in every
   reachable configuration and checks the new state is the table's entry, or
   that the input was absorbed (network: no state change, no output) or
   refused (TU: :class:`TransactionError`, no state change); and that every
   table entry is reached by the walk.
2. Hypothesis: any sequence of inputs (responses of random status, request
   retransmissions, ACKs, transport errors, clock jumps to random times or to
   the next deadline) keeps the machine in one of its states with only the
   timers that state may run, raises nothing but :class:`TransactionError`
   (and that only for TU input), and once terminated emits nothing more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sip.errors import TransactionError
from sip.headers import Headers
from sip.message import Request, make_response, serialize
from sip.transaction import (
    CLIENT_INVITE_TABLE,
    CLIENT_NON_INVITE_TABLE,
    SERVER_INVITE_TABLE,
    SERVER_NON_INVITE_TABLE,
    TIMER_INPUTS,
    TU_INPUTS,
    ClientInviteTransaction,
    ClientNonInviteTransaction,
    ClientTransaction,
    Input,
    ServerInviteTransaction,
    ServerNonInviteTransaction,
    ServerTransaction,
    State,
    TimerConfig,
    Transaction,
    TransactionLayer,
    TransactionTerminated,
    TransactionTimedOut,
    build_ack_for_non2xx,
)

DEST = ("192.0.2.9", 5060)
S, I = State, Input  # noqa: E741


def make_request(method: str) -> Request:
    return Request(
        method=method,
        uri="sip:bob@example.org",
        headers=Headers(
            [
                ("Via", "SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK-p"),
                ("From", "<sip:alice@example.org>;tag=a1"),
                ("To", "<sip:bob@example.org>"),
                ("Call-ID", "p@192.0.2.1"),
                ("CSeq", f"7 {method}"),
            ]
        ),
    )


Factory = Callable[[TimerConfig, bool], Transaction]


@dataclass(frozen=True)
class Machine:
    name: str
    factory: Factory
    table: dict[tuple[State, Input], State]
    inputs: tuple[Input, ...]  # the non-timer inputs it can be fed
    timers_by_state: dict[State, frozenset[str]]  # which timers may run in which state


def _client(cls: type[ClientTransaction], method: str) -> Factory:
    return lambda config, reliable: cls(make_request(method), DEST, config, reliable)


def _server(cls: type[ServerTransaction], method: str) -> Factory:
    return lambda config, reliable: cls(make_request(method), DEST, config, reliable)


CLIENT_INPUTS = (I.TU_REQUEST, I.RECV_1XX, I.RECV_2XX, I.RECV_FINAL, I.TRANSPORT_ERROR)
MACHINES = [
    Machine(
        "INVITE client",
        _client(ClientInviteTransaction, "INVITE"),
        CLIENT_INVITE_TABLE,
        CLIENT_INPUTS,
        {
            S.CALLING: frozenset("AB"),
            S.PROCEEDING: frozenset(),
            S.ACCEPTED: frozenset("M"),
            S.COMPLETED: frozenset("D"),
            S.TERMINATED: frozenset(),
        },
    ),
    Machine(
        "non-INVITE client",
        _client(ClientNonInviteTransaction, "OPTIONS"),
        CLIENT_NON_INVITE_TABLE,
        CLIENT_INPUTS,
        {
            S.TRYING: frozenset("EF"),
            S.PROCEEDING: frozenset("EF"),
            S.COMPLETED: frozenset("K"),
            S.TERMINATED: frozenset(),
        },
    ),
    Machine(
        "INVITE server",
        _server(ServerInviteTransaction, "INVITE"),
        SERVER_INVITE_TABLE,
        (I.TU_1XX, I.TU_2XX, I.TU_FINAL, I.RECV_REQUEST, I.RECV_ACK, I.TRANSPORT_ERROR),
        {
            S.PROCEEDING: frozenset(),
            S.ACCEPTED: frozenset("L"),
            S.COMPLETED: frozenset("GH"),
            S.CONFIRMED: frozenset("I"),
            S.TERMINATED: frozenset(),
        },
    ),
    Machine(
        "non-INVITE server",
        _server(ServerNonInviteTransaction, "OPTIONS"),
        SERVER_NON_INVITE_TABLE,
        (I.TU_1XX, I.TU_2XX, I.TU_FINAL, I.RECV_REQUEST, I.RECV_ACK, I.TRANSPORT_ERROR),
        {
            S.TRYING: frozenset(),
            S.PROCEEDING: frozenset(),
            S.COMPLETED: frozenset("J"),
            S.TERMINATED: frozenset(),
        },
    ),
]
IDS = [m.name for m in MACHINES]

STATUS = {I.RECV_1XX: 180, I.RECV_2XX: 200, I.RECV_FINAL: 486}
STATUS.update({I.TU_1XX: 180, I.TU_2XX: 200, I.TU_FINAL: 486})


def feed(txn: Transaction, inp: Input, now: float, status: int | None = None) -> None:
    """Apply one abstract input (a timer input means: the clock reaches ``now``)."""
    req = make_request(txn.method)
    code = status if status is not None else STATUS.get(inp, 0)
    if inp is I.TU_REQUEST:
        assert isinstance(txn, ClientTransaction)
        txn.send(txn.request, now)
    elif inp in (I.RECV_1XX, I.RECV_2XX, I.RECV_FINAL):
        assert isinstance(txn, ClientTransaction)
        txn.receive(make_response(req, code, to_tag="t"), now)
    elif inp in (I.TU_1XX, I.TU_2XX, I.TU_FINAL):
        assert isinstance(txn, ServerTransaction)
        txn.send(make_response(req, code, to_tag="t"), now)
    elif inp is I.RECV_REQUEST:
        assert isinstance(txn, ServerTransaction)
        txn.receive(req, now)
    elif inp is I.RECV_ACK:
        assert isinstance(txn, ServerTransaction)
        txn.receive(build_ack_for_non2xx(req, make_response(req, 486, to_tag="t")), now)
    elif inp is I.TRANSPORT_ERROR:
        txn.transport_error(now)
    else:
        txn.handle_timer(now)


def next_timer(txn: Transaction) -> tuple[Input, float] | None:
    """The timer that fires next: earliest deadline; on a tie the timeout (B, F, H) first."""
    timers = txn.timers()
    if not timers:
        return None
    _, _, name = min((t, n in "AEG", n) for n, t in timers.items())
    return TIMER_INPUTS[name], timers[name]


def drain(txn: Transaction) -> tuple[list[object], int]:
    events: list[object] = []
    while (event := txn.next_event()) is not None:
        events.append(event)
    return events, len(txn.datagrams_to_send())


# ------------------------------------------------------------ exhaustive table walk


Step = tuple[Input, float]


def replay(machine: Machine, config: TimerConfig, reliable: bool, path: list[Step]) -> Transaction:
    txn = machine.factory(config, reliable)
    for inp, now in path:  # only applied steps are queued: none raises
        feed(txn, inp, now)
    return txn


def walk(machine: Machine, reliable: bool) -> set[tuple[State, Input]]:
    """Breadth-first over configurations (state, running timers, sent?); check every step."""
    config = TimerConfig()
    reached: set[tuple[State, Input]] = set()
    seen: set[object] = set()
    queue: deque[list[Step]] = deque([[]])
    while queue:
        path = queue.popleft()
        txn = replay(machine, config, reliable, path)
        sent = any(inp is I.TU_REQUEST for inp, _ in path)
        config_key = (txn.state, frozenset(txn.timers()), sent)
        if config_key in seen:
            continue
        seen.add(config_key)
        now = path[-1][1] if path else 0.0
        choices: list[Step] = [(inp, now) for inp in machine.inputs]
        if (due := next_timer(txn)) is not None:
            choices.append(due)
        for inp, at in choices:
            txn = replay(machine, config, reliable, path)
            drain(txn)
            before = txn.state
            expected = machine.table.get((before, inp))
            refused = inp in TU_INPUTS and (expected is None or (inp is I.TU_REQUEST and sent))
            if refused:
                with pytest.raises(TransactionError):
                    feed(txn, inp, at)
                assert txn.state is before
                assert drain(txn) == ([], 0)
                continue
            feed(txn, inp, at)
            if expected is None:
                # Absorbed network input: no state change, nothing out.
                assert txn.state is before, (machine.name, before, inp)
                assert drain(txn) == ([], 0), (machine.name, before, inp)
                continue
            assert txn.state is expected, (machine.name, before, inp, txn.state)
            reached.add((before, inp))
            queue.append([*path, (inp, at)])
    return reached


@pytest.mark.parametrize("machine", MACHINES, ids=IDS)
def test_transition_table_is_the_single_source_of_truth(machine: Machine) -> None:
    reached = walk(machine, reliable=False) | walk(machine, reliable=True)
    # Every transition observed is a table entry (checked in walk), and every entry is
    # reachable: the table has no dead rows.
    assert reached == set(machine.table)
    # Every state named in a table has a timer policy in this test, and vice versa.
    states = {s for s, _ in machine.table} | set(machine.table.values())
    assert states == set(machine.timers_by_state)


# ------------------------------------------------------------------- Hypothesis


ACTIONS = st.one_of(
    st.tuples(st.just("input"), st.sampled_from(list(Input)), st.integers(100, 699)),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 4.0, 5.0, 31.9, 64.0])),
    st.tuples(st.just("next"), st.floats(0.0, 0.2)),
)
CONFIGS = st.builds(
    TimerConfig,
    t1=st.sampled_from([0.1, 0.5, 1.0]),
    t2=st.sampled_from([0.2, 4.0]),
    t4=st.sampled_from([0.0, 5.0]),
    timer_d=st.sampled_from([0.0, 32.0]),
)


@pytest.mark.parametrize("machine", MACHINES, ids=IDS)
@settings(max_examples=150, deadline=None)
@given(config=CONFIGS, reliable=st.booleans(), actions=st.lists(ACTIONS, max_size=30))
def test_any_input_sequence_keeps_the_machine_sound(
    machine: Machine,
    config: TimerConfig,
    reliable: bool,
    actions: list[tuple[object, ...]],
) -> None:
    txn = machine.factory(config, reliable)
    now = 0.0
    terminated_at: int | None = None
    timed_out = 0
    for index, action in enumerate(actions):
        kind = action[0]
        raised = False
        if kind == "input":
            inp, status = action[1], action[2]
            assert isinstance(inp, Input) and isinstance(status, int)
            if inp not in machine.inputs:
                continue
            try:
                feed(txn, inp, now, status)
            except TransactionError:
                assert inp in TU_INPUTS, "only TU input may be refused"
                raised = True
        else:
            step = action[1]
            assert isinstance(step, float)
            deadline = txn.get_timer()
            if kind == "next" and deadline is not None:
                now = max(now, deadline + step)
            else:
                now += step
            txn.handle_timer(now)
            after = txn.get_timer()
            assert after is None or after > now, "a due timer survived handle_timer"
        assert txn.state in machine.timers_by_state
        assert set(txn.timers()) <= machine.timers_by_state[txn.state]
        assert all(t >= 0 for t in txn.timers().values())
        events = []
        while (event := txn.next_event()) is not None:
            events.append(event)
        out = txn.datagrams_to_send()
        assert all(dest == DEST for _, dest in out)
        if terminated_at is not None:
            assert events == [] and out == [], "a terminated transaction spoke"
            assert txn.get_timer() is None
            continue
        timed_out += sum(isinstance(e, TransactionTimedOut) for e in events)
        if txn.terminated:
            terminated_at = index
            assert events[-1] == TransactionTerminated(txn.key)
            assert txn.get_timer() is None
        else:
            assert not any(isinstance(e, TransactionTerminated) for e in events)
        if raised:
            assert events == [] and out == []
    assert timed_out <= 1


# ------------------------------------------------------------ the layer's boundary

SEEDS = [
    serialize(make_request("INVITE")),
    serialize(make_request("ACK")),
    serialize(make_request("CANCEL")),
    serialize(make_response(make_request("INVITE"), 486, to_tag="x")),
    serialize(make_response(make_request("OPTIONS"), 200, to_tag="x")),
]


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, len(data) - 1))
        data[pos : pos + draw(st.integers(0, 3))] = draw(st.binary(max_size=3))
    return bytes(data)


@settings(max_examples=200, deadline=None)
@given(
    datagrams=st.lists(
        st.tuples(st.one_of(mangled(), st.binary(max_size=64)), st.booleans()), max_size=8
    ),
    ticks=st.lists(st.sampled_from([0.0, 0.5, 5.0, 40.0]), max_size=3),
)
def test_layer_takes_any_datagram_without_raising(
    datagrams: list[tuple[bytes, bool]], ticks: list[float]
) -> None:
    layer = TransactionLayer()
    layer.send_request(make_request("INVITE"), DEST, 0.0)
    now = 0.0
    for data, reliable in datagrams:
        layer.receive_datagram(data, DEST, now, reliable)
    for step in ticks:
        now += step
        layer.handle_timer(now)
    while layer.next_event() is not None:
        pass
    layer.datagrams_to_send()
    assert layer.dropped + layer.strays <= len(datagrams)
