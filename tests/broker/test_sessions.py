"""The Session Manager (mdeci/broker/sessions.py) without sockets, on a fake clock: every
(status, event) pair of its table, random runs against its invariants, and the stories
the e2e tests tell (move, outage, re-key, restart on the store, takeover, kick, key
confirmation timeout)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.broker.sessions import (
    TRANSITIONS,
    Attach,
    Command,
    Detach,
    DialogId,
    DialogUp,
    Event,
    InviteAnswered,
    Log,
    SendBye,
    SessionManager,
    SetStatus,
    SmsLook,
    SmsStop,
    Status,
    StoreSession,
)
from rudp.keys import public_tag

ALICE = "sip:alice@example.org"
BOB = "sip:bob@example.org"
TIMEOUT = 10.0


@dataclass
class Clock:
    now: float = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Agent:
    """What one user's agent does to the manager: INVITEs, re-INVITEs, BYE."""

    def __init__(self, manager: SessionManager, clock: Clock, uri: str, n: int = 0) -> None:
        self.m, self.clock, self.uri = manager, clock, uri
        self.n = n  # makes Call-IDs, tags and keys unique per agent
        self.calls = 0
        self.dialog: DialogId | None = None
        self.kx = b""
        self.key = b""

    def _fresh(self) -> tuple[bytes, bytes]:
        self.calls += 1
        tag = f"{self.n}-{self.calls}".encode()
        return b"kx-" + tag, b"key-" + tag.ljust(16, b"0")

    def invite(self, addr: tuple[str, int] = ("10.0.0.1", 4000)) -> list[Command]:
        """A new dialog (a first INVITE, or a restarted agent's), answered and started."""
        kx, key = self._fresh()
        call_id, tag = f"call-{self.n}-{self.calls}", f"from-{self.n}-{self.calls}"
        self.dialog, self.kx, self.key = (call_id, "ours", tag), kx, key
        out = self.m.answered(self._answer(call_id, tag, None, addr, kx, key, new=True))
        return out + self.m.dialog_up(self._up(refreshed=False), self.clock.now)

    def reinvite(self, addr: tuple[str, int], *, rekey: bool = False) -> list[Command]:
        assert self.dialog is not None
        call_id, _, tag = self.dialog
        kx, key = self._fresh() if rekey else (self.kx, self.key)
        self.kx, self.key = kx, key
        out = self.m.answered(self._answer(call_id, tag, self.dialog, addr, kx, key, new=rekey))
        return out + self.m.dialog_up(self._up(refreshed=True), self.clock.now)

    def bye(self) -> list[Command]:
        assert self.dialog is not None
        return self.m.dialog_ended(self.dialog, self.uri, "bye")

    def _answer(
        self,
        call_id: str,
        tag: str,
        dialog: DialogId | None,
        addr: tuple[str, int],
        kx: bytes,
        key: bytes,
        *,
        new: bool,
    ) -> InviteAnswered:
        version = self.m.version(self.uri, call_id, tag)
        return InviteAnswered(
            uri=self.uri,
            call_id=call_id,
            from_tag=tag,
            dialog_id=dialog,
            media_addr=addr,
            kx=kx,
            key=key,
            new_keys=new,
            offer="v=0",
            version=1 if version is None else version + 1,
            msisdn="+5511",
        )

    def _up(self, *, refreshed: bool) -> DialogUp:
        assert self.dialog is not None
        return DialogUp(self.dialog, "sip:a@10.0.0.1", "", 1, 2, refreshed, wall=self.clock.now)

    @property
    def epoch(self) -> int:
        s = self.m.get(self.uri)
        assert s is not None
        return s.epoch


def of(kind: type, commands: list[Command]) -> list[Command]:
    return [c for c in commands if isinstance(c, kind)]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def manager() -> SessionManager:
    return SessionManager(TIMEOUT)


# ---------------------------------------------------------------------------- the table


def _in_state(status: Status) -> tuple[SessionManager, Clock, Agent]:
    m, clock = SessionManager(TIMEOUT), Clock()
    agent = Agent(m, clock, ALICE)
    if status is not Status.NONE:
        agent.invite()
        agent.m.media_heard(ALICE, agent.epoch, ("10.0.0.1", 4000))
    if status is Status.DISCONNECTED:
        agent.m.media_failed(ALICE, agent.epoch, "no ACK")
    assert m.status(ALICE) is status
    return m, clock, agent


def _fire(m: SessionManager, clock: Clock, agent: Agent, event: Event) -> list[Command]:
    """``event`` for ALICE as its source gives it (for a user without a session too)."""
    s = m.get(ALICE)
    epoch = 0 if s is None else s.epoch
    if event is Event.STARTED:
        return agent.invite() if agent.dialog is None else agent.reinvite(("10.0.0.2", 4000))
    if event is Event.REKEYED:
        if agent.dialog is None:
            agent.dialog = ("call-x", "ours", "from-x")
        call_id, _, tag = agent.dialog
        kx, key = agent._fresh()
        return m.answered(
            agent._answer(call_id, tag, agent.dialog, ("10.0.0.3", 1), kx, key, new=True)
        )
    if event is Event.HEARD:
        return m.media_heard(ALICE, epoch, ("10.0.0.4", 4000))
    if event is Event.FAILED:
        return m.media_failed(ALICE, epoch, "no ACK")
    if event is Event.PROVED:
        return m.path_proved(ALICE, epoch)
    if event is Event.ENDED:
        return (
            agent.bye()
            if agent.dialog is not None
            else m.dialog_ended(("c", "l", "r"), ALICE, "bye")
        )
    if event is Event.LOST:
        return m.lost(ALICE, "broker-b", 9)
    assert event is Event.RESTORED
    return m.restored(ALICE, ("call-r", "ours", "from-r"), ("10.0.0.5", 1), b"k" * 16, None, 5.0)


@pytest.mark.parametrize("event", list(Event))
@pytest.mark.parametrize("status", list(Status))
def test_every_status_and_event_follows_the_table(status: Status, event: Event) -> None:
    m, clock, agent = _in_state(status)
    commands = _fire(m, clock, agent, event)
    after = m.status(ALICE)
    assert after is TRANSITIONS.get((status, event), status)
    for c in of(SetStatus, commands):
        assert isinstance(c, SetStatus)
        assert c.status is after
    if (status, event) not in TRANSITIONS:
        assert commands == []  # a pair the table leaves out changes nothing
    if after is Status.NONE:
        assert m.get(ALICE) is None and of(Attach, commands) == []


def test_a_user_lost_to_another_broker_is_dropped_without_a_word_to_the_agent_or_store(
    clock: Clock,
) -> None:
    m = SessionManager(TIMEOUT)
    agent = Agent(m, clock, ALICE)
    first = agent.invite()
    (row,) = of(StoreSession, first)
    assert isinstance(row, StoreSession) and row.refresh is False  # a new session claims
    refresh = agent.reinvite(("10.0.0.2", 4000))
    (row,) = of(StoreSession, refresh)
    assert isinstance(row, StoreSession) and row.refresh is True  # a refresh is fenced
    epoch = agent.epoch
    commands = m.lost(ALICE, "broker-b", 7)
    # No status write (the row is the new holder's), no BYE (so is the agent).
    assert of(SetStatus, commands) == [] and of(SendBye, commands) == []
    assert commands == [
        Detach(ALICE, "lost to broker-b at epoch 7", forget=True),
        Log(
            "session_ended",
            ALICE,
            (
                ("call_id", agent.dialog[0] if agent.dialog else ""),
                ("addr", "10.0.0.2:4000"),
                ("reason", "lost to broker-b at epoch 7"),
            ),
        ),
    ]
    assert m.get(ALICE) is None and m.status(ALICE) is Status.NONE
    # Whatever of the old association still completes says nothing now, and a second
    # refusal of the same user changes nothing.
    assert m.media_failed(ALICE, epoch, "no ACK") == []
    assert m.lost(ALICE, "broker-b", 7) == []
    # Her next INVITE here is a new session, which claims her again.
    agent.dialog = None
    (row,) = of(StoreSession, agent.invite())
    assert isinstance(row, StoreSession) and row.refresh is False


def test_the_table_knows_every_status_reached() -> None:
    reached = set(TRANSITIONS.values()) | {s for s, _ in TRANSITIONS}
    assert reached == set(Status)


# ---------------------------------------------------------------------------- random runs

ACTIONS = st.sampled_from(
    ["invite", "move", "rekey", "bye", "heard", "failed", "stale_failed", "proved", "kick", "tick"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), ACTIONS), max_size=40))
def test_random_runs_keep_the_invariants(steps: list[tuple[int, str]]) -> None:
    m, clock = SessionManager(TIMEOUT), Clock()
    agents = [Agent(m, clock, f"sip:u{i}@example.org", i) for i in range(3)]
    epochs = {a.uri: 0 for a in agents}
    for who, action in steps:
        a = agents[who]
        s = m.get(a.uri)
        live = s is not None and a.dialog is not None and s.dialog_id == a.dialog
        epoch = 0 if s is None else s.epoch
        if action == "invite" or (action in ("move", "rekey", "bye") and not live):
            out = a.invite()
        elif action == "move":
            out = a.reinvite(("10.9.9.9", 5000 + len(steps)))
        elif action == "rekey":
            out = a.reinvite(("10.9.9.8", 5000), rekey=True)
        elif action == "bye":
            out = a.bye()
        elif action == "heard":
            out = m.media_heard(a.uri, epoch, ("10.0.0.1", 4000))
        elif action == "failed":
            out = m.media_failed(a.uri, epoch, "no ACK")
        elif action == "stale_failed":
            out = m.media_failed(a.uri, epoch - 1, "no ACK")
            assert out == []  # an earlier connection's failure says nothing now
        elif action == "proved":
            out = m.path_proved(a.uri, epoch)
        elif action == "kick":
            out = m.kick(a.uri)
        else:
            clock.advance(TIMEOUT / 2)
            out = m.timer(clock.now)
        for c in out:
            if isinstance(c, Attach):
                assert m.get(c.session.uri) is c.session  # the one record, never a copy
                assert c.session.status is Status.CONNECTED
                if not c.moved:
                    assert c.session.epoch > epochs[c.session.uri]  # epochs only grow
                    epochs[c.session.uri] = c.session.epoch
            if isinstance(c, SetStatus):
                assert m.status(c.uri) is c.status
            if isinstance(c, StoreSession):
                assert m.is_connected(c.uri)
        # One owner per dialog and per key-exchange value, both pointing back.
        for agent in agents:
            session = m.get(agent.uri)
            if session is None:
                continue
            assert session.dialog_id is not None
            assert m.owner(session.dialog_id, agent.uri) == agent.uri
            if session.kx is not None:
                assert session.kx == public_tag(agent.kx) and m.kx_holder(agent.kx) == agent.uri
        timer = m.next_timer()
        assert timer is None or timer > clock.now - TIMEOUT


# ---------------------------------------------------------------------------- stories


def test_invite_stores_the_session_once_then_delivers(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    out = alice.invite()
    assert [type(c) for c in out] == [StoreSession, Log, Attach]  # one status write: the row's
    row = out[0]
    assert isinstance(row, StoreSession)
    assert (row.uri, row.media_addr, row.msisdn, row.started_at) == (
        ALICE,
        "10.0.0.1:4000",
        "+5511",
        clock.now,
    )
    log = out[1]
    assert isinstance(log, Log) and log.event == "session_started"
    assert (
        manager.is_connected(ALICE) and manager.owner(alice.dialog or ("", "", ""), ALICE) == ALICE
    )
    assert manager.kx_holder(alice.kx) == ALICE
    assert manager.version(ALICE, *alice.dialog[::2] if alice.dialog else ("", "")) == 1
    # The session keeps its dialog's version: no table entry per live session; its
    # Call-ID and tag are its dialog id's (14 slots, no copies).
    assert not manager._versions
    session = manager.get(ALICE)
    assert session is not None and alice.dialog is not None
    assert (session.call_id, session.remote_tag) == (alice.dialog[0], alice.dialog[2])
    assert sys.getsizeof(session) <= 144
    # Nor is the session found by its dialog through a table of the manager's own: the
    # UA holds the dialogs, and the dialog names its user (its remote AOR).
    assert not [t for t in vars(manager).values() if isinstance(t, dict) and alice.dialog in t]


def test_move_keeps_the_association_and_sends_nothing_again(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    alice.invite()
    epoch = alice.epoch
    out = alice.reinvite(("10.0.0.9", 4001))
    attach = of(Attach, out)
    assert len(attach) == 1 and isinstance(attach[0], Attach) and attach[0].moved
    assert attach[0].addr == ("10.0.0.9", 4001)
    assert alice.epoch == epoch and of(SetStatus, out) == []
    log = of(Log, out)[0]
    assert isinstance(log, Log) and log.event == "session_reinvited"
    assert dict(log.fields)["prev_addr"] == "10.0.0.1:4000"


def test_outage_disconnects_once_and_the_agent_talking_again_reconnects(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    alice.invite()
    epoch = alice.epoch
    assert manager.path_proved(ALICE, epoch) == [SmsStop(ALICE)]
    out = manager.media_failed(ALICE, epoch, "no ACK after retries")
    assert out == [
        SetStatus(ALICE, Status.DISCONNECTED),
        Detach(ALICE, "rudp: no ACK after retries", forget=False),
        SmsLook(ALICE),
    ]
    assert manager.media_failed(ALICE, epoch, "again") == []  # said once
    out = manager.media_heard(ALICE, epoch, ("10.0.0.7", 4000))
    assert [type(c) for c in out] == [Attach, SetStatus]
    assert alice.epoch > epoch and manager.is_connected(ALICE)
    assert manager.media_failed(ALICE, epoch, "late") == []  # the old epoch's failure
    assert manager.path_proved(ALICE, alice.epoch) == [SmsStop(ALICE)]
    assert manager.path_proved(ALICE, alice.epoch) == []  # once per attachment


def test_rekey_switches_at_the_answer_and_frees_the_old_value(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    alice.invite()
    old_kx, old_key, epoch = alice.kx, alice.key, alice.epoch
    assert alice.dialog is not None
    call_id, _, tag = alice.dialog
    kx, key = alice._fresh()
    out = manager.answered(
        alice._answer(call_id, tag, alice.dialog, ("10.0.0.1", 4000), kx, key, new=True)
    )
    # The agent sends under the new keys once it has the answer: the switch is now.
    assert [type(c) for c in out] == [Attach, SetStatus]
    attach = out[0]
    assert isinstance(attach, Attach) and attach.session.key == key and not attach.moved
    assert alice.epoch > epoch
    assert manager.kx_holder(old_kx) is None and manager.kx_holder(kx) == ALICE
    alice.kx, alice.key = kx, key
    refreshed = manager.dialog_up(alice._up(refreshed=True), clock.now)
    assert [c.moved for c in of(Attach, refreshed) if isinstance(c, Attach)] == [True]
    assert old_key != key


def test_restart_restores_stored_sessions_and_marks_unreadable_ones(
    manager: SessionManager,
) -> None:
    dialog = ("call-1", "ours", "from-1")
    out = manager.restored(ALICE, dialog, ("10.0.0.1", 4000), b"k" * 16, b"kx", 5.0)
    assert [type(c) for c in out] == [Attach]  # stored CONNECTED: nothing to write
    assert manager.owner(dialog, ALICE) == ALICE and manager.kx_holder(b"kx") == ALICE
    assert manager.unrestorable(BOB) == [SetStatus(BOB, Status.DISCONNECTED)]
    assert manager.unrestorable(ALICE) == []  # a live session is not marked


def test_a_restored_quic_session_ends_with_a_bye_so_its_agent_invites_again(
    manager: SessionManager,
) -> None:
    """The QUIC connection died with the broker and only the agent can open another:
    the stored session is ENDED and BYEd instead of waiting for QUIC's idle timeout."""
    dialog = ("call-1", "ours", "from-1")
    out = manager.restored(ALICE, dialog, ("10.0.0.1", 4000), b"k" * 16, b"kx", 5.0, "quic")
    assert [type(c) for c in out] == [SetStatus, Log, SendBye]
    assert out[0] == SetStatus(ALICE, Status.NONE) and out[2] == SendBye(dialog)
    log = out[1]
    assert isinstance(log, Log) and "QUIC" in str(dict(log.fields)["reason"])
    assert manager.get(ALICE) is None and manager.owner(dialog, ALICE) is None
    assert manager.kx_holder(b"kx") is None


def test_the_stored_row_names_the_transport_the_answer_accepted(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    alice.dialog = ("call-q", "ours", "from-q")
    answer = alice._answer("call-q", "from-q", None, ("10.0.0.1", 4000), b"kx", b"k" * 16, new=True)
    manager.answered(replace(answer, transport="quic"))
    rows = of(StoreSession, manager.dialog_up(alice._up(refreshed=False), clock.now))
    assert [r.transport for r in rows if isinstance(r, StoreSession)] == ["quic"]


def test_new_dialog_of_the_same_user_takes_over_and_byes_the_old(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    alice.invite()
    old_dialog, old_kx, epoch = alice.dialog, alice.kx, alice.epoch
    clock.advance(60)
    out = alice.invite(("10.0.0.2", 4000))
    assert out[0] == SendBye(old_dialog or ("", "", ""))
    row = of(StoreSession, out)[0]
    assert isinstance(row, StoreSession) and row.started_at == clock.now
    assert manager.owner(old_dialog or ("", "", ""), ALICE) is None
    assert manager.kx_holder(old_kx) is None and alice.epoch > epoch
    # The old dialog's late refresh must not put the user back on its keys.
    late = DialogUp(old_dialog or ("", "", ""), "t", "", 1, 2, True, wall=clock.now)
    assert manager.dialog_up(late, clock.now) == []
    # Nor does its BYE end the new session.
    assert manager.dialog_ended(old_dialog or ("", "", ""), ALICE, "bye") == []
    assert manager.is_connected(ALICE)


def test_kick_ends_with_bye_and_forgets(manager: SessionManager, clock: Clock) -> None:
    alice = Agent(manager, clock, ALICE)
    alice.invite()
    assert alice.dialog is not None
    out = manager.kick(ALICE)
    assert [type(c) for c in out] == [SetStatus, Detach, Log, SendBye]
    log = out[2]
    assert isinstance(log, Log) and dict(log.fields)["reason"] == "kicked"
    assert manager.get(ALICE) is None and manager.owner(alice.dialog, ALICE) is None
    assert manager.version(ALICE, alice.dialog[0], alice.dialog[2]) is None
    assert manager.kick(ALICE) == []


def test_drain_ends_every_session_with_bye_and_the_next_drain_finds_none(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    bob = Agent(manager, clock, BOB)
    alice.invite()
    clock.advance(1.0)
    bob.invite()
    out = manager.drain()
    byes = [c for c in out if isinstance(c, SendBye)]
    assert [c.dialog_id for c in byes] == [alice.dialog, bob.dialog]
    ended = [c for c in out if isinstance(c, Log)]
    assert {c.uri for c in ended} == {ALICE, BOB}
    assert all(dict(c.fields)["reason"] == "drained" for c in ended)
    assert SetStatus(ALICE, Status.NONE) in out and SetStatus(BOB, Status.NONE) in out
    assert len(manager) == 0 and manager.get(ALICE) is None
    assert manager.drain() == []


def test_unconfirmed_keys_end_the_session_at_the_deadline(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    alice.invite()
    assert manager.next_timer() == clock.now + TIMEOUT
    # Re-keying again and again does not postpone the verdict.
    clock.advance(TIMEOUT / 2)
    alice.reinvite(("10.0.0.1", 4000), rekey=True)
    assert manager.next_timer() == clock.now + TIMEOUT / 2
    assert manager.timer(clock.now) == []
    clock.advance(TIMEOUT / 2)
    out = manager.timer(clock.now)
    assert [type(c) for c in out] == [SetStatus, Detach, Log, SendBye]
    log = out[2]
    assert isinstance(log, Log) and dict(log.fields)["reason"] == "key mismatch"
    assert manager.get(ALICE) is None and manager.next_timer() is None


def test_keys_heard_in_time_are_confirmed(manager: SessionManager, clock: Clock) -> None:
    alice = Agent(manager, clock, ALICE)
    alice.invite()
    assert manager.media_heard(ALICE, alice.epoch, ("10.0.0.1", 4000)) == []
    clock.advance(TIMEOUT)
    assert manager.timer(clock.now) == []
    assert manager.is_connected(ALICE) and manager.next_timer() is None


def test_kx_value_of_an_answer_in_progress_is_held(manager: SessionManager) -> None:
    answer = InviteAnswered(
        uri=BOB,
        call_id="c",
        from_tag="t",
        dialog_id=None,
        media_addr=("10.0.0.1", 1),
        kx=b"shared",
        key=b"k" * 16,
        new_keys=True,
        offer="v=0",
        version=1,
    )
    assert manager.answered(answer) == []
    assert manager.kx_holder(b"shared") == BOB
    assert manager.status(BOB) is Status.NONE  # not a session before its dialog starts


def test_sessions_made_without_sip_connect_and_disconnect(manager: SessionManager) -> None:
    out = manager.connect(ALICE, ("10.0.0.1", 1), b"k" * 16, alive=False)
    assert [type(c) for c in out] == [Attach, SetStatus]
    out = manager.connect(ALICE, ("10.0.0.2", 1), b"k" * 16, alive=True)
    assert [c.moved for c in out if isinstance(c, Attach)] == [True]
    out = manager.disconnect(ALICE, ended=False)
    assert out == [
        SetStatus(ALICE, Status.DISCONNECTED),
        Detach(ALICE, "sip", forget=True),
        SmsLook(ALICE),
    ]
    assert manager.get(ALICE) is None


def test_the_session_records_its_transport_and_a_switch_is_a_new_association(
    manager: SessionManager, clock: Clock
) -> None:
    alice = Agent(manager, clock, ALICE)
    kx, key = alice._fresh()
    alice.dialog, alice.kx, alice.key = ("call-q", "ours", "tag-q"), kx, key
    answer = alice._answer("call-q", "tag-q", None, ("10.0.0.1", 4000), kx, key, new=True)
    manager.answered(replace(answer, transport="quic"))
    manager.dialog_up(alice._up(refreshed=False), clock.now)
    s = manager.get(ALICE)
    assert s is not None and s.transport == "quic"
    epoch = alice.epoch
    # A move on the same transport keeps the association.
    answer = alice._answer("call-q", "tag-q", alice.dialog, ("10.0.0.9", 4001), kx, key, new=False)
    manager.answered(replace(answer, transport="quic"))
    [attach] = of(Attach, manager.dialog_up(alice._up(refreshed=True), clock.now))
    assert isinstance(attach, Attach) and attach.moved and s.transport == "quic"
    assert alice.epoch == epoch
    # The same keys answered on the other transport: a new association, a new epoch.
    answer = alice._answer("call-q", "tag-q", alice.dialog, ("10.0.0.9", 4001), kx, key, new=False)
    manager.answered(answer)  # transport "rudp"
    out = manager.dialog_up(alice._up(refreshed=True), clock.now)
    [attach] = of(Attach, out)
    assert isinstance(attach, Attach) and not attach.moved
    assert s.transport == "rudp" and alice.epoch > epoch
    # A QUIC connection that ends marks the user DISCONNECTED, named by its transport.
    s.transport = "quic"
    out = manager.media_failed(ALICE, alice.epoch, "idle timeout")
    assert Detach(ALICE, "quic: idle timeout", forget=False) in out
    assert SetStatus(ALICE, Status.DISCONNECTED) in out and not manager.is_connected(ALICE)
