"""AgentCore on a fake clock, with no sockets: inputs in, commands and events out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.core import AgentCore
from mdeci.agent.events import (
    Alert,
    AttachMedia,
    ChurnRecord,
    Command,
    CoreEvent,
    Delivered,
    Invite,
    MoveSip,
    Rebind,
    Register,
    Reinvite,
    RequestDone,
    RequestFailed,
    SendFrame,
    SipCommand,
    SipOutcome,
    StoreReplaced,
)
from mdeci.agent.machine import State, Status
from mdeci.agent.requests import RESEND_AFTER
from mdeci.agent.state import SUBS_FILE, Fsync, StateFiles, SubsRecord, open_state_files
from mdeci.config import (
    AgentConfig,
    AgentRegistrarConfig,
    BrokerPeerConfig,
    HostPort,
    ReconnectConfig,
)
from mdeci.frames import (
    Error,
    Frame,
    List,
    Notify,
    Pub,
    PubOk,
    Sub,
    SubInfo,
    SubOk,
    Subs,
    decode,
    encode,
)
from rudp.keys import KeyExchange
from sip.sdp import build_answer, parse_session
from tests.keyx import psk

T0 = 1_700_000_000.0
SIP = ("127.0.0.2", 5062)
MEDIA = ("127.0.0.2", 4000)
BROKER_MEDIA = ("127.0.0.1", 7000)


def config(state: Path) -> AgentConfig:
    where = HostPort("127.0.0.1", 5060)
    return AgentConfig(
        aor="sip:alice@localhost",
        password="alice-secret",
        state_dir=state,
        registrar=AgentRegistrarConfig(address=where, expires=600),
        broker=BrokerPeerConfig(aor="sip:broker@localhost", address=where),
        reconnect=ReconnectConfig(base=1.0, max=8.0, jitter=0.2),
    )


def open_files(state: Path, fsync: Fsync = os.fsync) -> StateFiles:
    state.mkdir(parents=True, exist_ok=True)
    return open_state_files(state, fsync)


class Counter:
    """Deterministic random bytes: every call gives new ones."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, size: int) -> bytes:
        self.n += 1
        return self.n.to_bytes(4, "big") * (size // 4) + b"\x00" * (size % 4)


class Rig:
    """One core, its event list and its commands; the clock is ``self.now``."""

    def __init__(self, state: Path, fsync: Fsync = os.fsync) -> None:
        self.now = T0
        self.events: list[CoreEvent] = []
        self.files = open_files(state, fsync)
        self.secret: bytes | None = None  # the last session secret the "broker" derived
        self._answers = 0
        self.core = AgentCore(
            config(state),
            self.files,
            self.events.append,
            random_bytes=Counter(),
            jitter=lambda: 0.5,  # factor 1: the delays are base * 2**n exactly
            sip_addr=SIP,
            media_addr=MEDIA,
        )

    def commands(self) -> list[Command]:
        out = []
        while (command := self.core.next_command()) is not None:
            out.append(command)
        return out

    def frames(self, commands: list[Command]) -> list[Frame]:
        return [decode(c.data) for c in commands if isinstance(c, SendFrame)]

    def sip(self, commands: list[Command]) -> SipCommand:
        found = [c for c in commands if isinstance(c, Register | Invite | Reinvite | MoveSip)]
        assert len(found) == 1, commands
        return found[0]

    def churn(self) -> list[str]:
        return [str(e.event) for e in self.events if isinstance(e, ChurnRecord)]

    def churn_record(self, name: str) -> dict[str, Any]:
        return [dict(e.fields) for e in self.events if isinstance(e, ChurnRecord)][
            self.churn().index(name)
        ]

    def answer(
        self, offer: bytes, store: str | None = "store-1", *, new_keys: bool = True
    ) -> bytes:
        """The broker's answer; ``new_keys``: with its key-exchange value (the secret it
        derives goes to ``self.secret``), else keeping the current keys."""
        self._answers += 1
        broker_kx = KeyExchange(bytes([self._answers]) * 32)  # one exchange per use
        public = broker_kx.public if new_keys else None
        text = build_answer(offer, "broker", 1, 1, *BROKER_MEDIA, key=public)
        if store is not None:
            head, sep, rest = text.partition("m=")
            text = f"{head}a=mdeci-store:{store}\r\n{sep}{rest}"
        body = text.encode()
        if new_keys:
            agent_public = parse_session(offer, require_key=True).key
            assert agent_public is not None
            self.secret = broker_kx.session_secret(
                agent_public, psk("alice", "localhost", "alice-secret"), offer, body
            )
        return body

    def ok(self, command: SipCommand, body: bytes = b"", **fields: Any) -> list[Command]:
        self.core.sip_done(
            self.now, command, SipOutcome(status=200, body=body, call_id="call-1", **fields)
        )
        return self.commands()

    def connect(self, store: str | None = "store-1", subs: tuple[SubInfo, ...] = ()) -> None:
        """Registration, session and probe, all answered."""
        self.core.start(self.now)
        register = self.sip(self.commands())
        invite = self.sip(self.ok(register))
        after = self.ok(invite, self.answer(invite.offer, store))  # type: ignore[union-attr]
        probe = self.frames(after)[-1]
        assert isinstance(probe, List)
        self.core.frame_received(self.now, encode(Subs(req=probe.req, items=subs)))

    def notify_frame(self, nseq: int) -> bytes:
        return encode(
            Notify(
                nseq=nseq,
                sub_id="1",
                subject="news.a",
                msg_id=f"m{nseq}",
                published_at=self.now - 0.25,
                attrs={},
                payload=b"x",
            )
        )

    def notify(self, nseq: int) -> list[Command]:
        self.core.frame_received(self.now, self.notify_frame(nseq))
        return self.commands()


def state_of(core: AgentCore) -> State:
    """The core's state, read afresh (mypy would keep an earlier assert's narrowing)."""
    return core.state


def status_of(core: AgentCore) -> Status:
    return core.status


def test_registration_session_and_probe(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    core = rig.core
    core.start(rig.now)
    register = rig.sip(rig.commands())
    assert register == Register(600) and core.state is State.REGISTERING
    after = rig.ok(register)
    invite = rig.sip(after)
    assert isinstance(invite, Invite)
    offer = parse_session(invite.offer, require_key=True)
    assert (offer.addr, offer.port) == MEDIA and offer.key is not None
    after = rig.ok(invite, rig.answer(invite.offer))
    # The secret both ends derive; never the value the offer carried.
    assert rig.secret is not None and rig.secret != offer.key
    assert AttachMedia(rig.secret, BROKER_MEDIA) in after
    assert state_of(core) is State.PROBING and status_of(core) is Status.DISCONNECTED
    (probe,) = rig.frames(after)
    assert isinstance(probe, List)
    core.frame_received(rig.now, encode(Subs(req=probe.req)))
    assert state_of(core) is State.CONNECTED and status_of(core) is Status.CONNECTED
    assert rig.churn() == ["registered", "session_started", "media_connected"]
    assert core.call_id == "call-1" and core.store_id == "store-1"


def test_move_keeps_the_session_and_reports_the_restore_time(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    core = rig.core
    core.address_changed(rig.now, "127.0.0.3")
    commands = rig.commands()
    assert commands[0] == Rebind("127.0.0.3") and rig.sip(commands) == MoveSip("127.0.0.3")
    assert core.state is State.MOVING and core.status is Status.CONNECTED
    core.media_bound(rig.now, ("127.0.0.3", 4000))
    rig.now += 0.04
    reinvite = rig.sip(rig.ok(MoveSip("127.0.0.3"), local_addr=("127.0.0.3", 5070)))
    assert isinstance(reinvite, Reinvite)
    offer = parse_session(reinvite.offer)
    assert (offer.addr, offer.port) == ("127.0.0.3", 4000)
    first = rig.secret
    rig.now += 0.01
    # A move keeps the keys: the same public value, and an answer without a new one.
    after = rig.ok(reinvite, rig.answer(reinvite.offer, new_keys=False))
    assert AttachMedia(first, BROKER_MEDIA) in after  # type: ignore[arg-type]
    assert state_of(core) is State.CONNECTED and status_of(core) is Status.CONNECTED
    assert rig.churn()[3:] == ["ip_changed", "registered", "session_reinvited", "media_connected"]
    changed = rig.churn_record("ip_changed")
    assert (changed["addr"], changed["prev_addr"]) == ("127.0.0.3:5070", "127.0.0.2:5062")
    restored = [dict(e.fields) for e in rig.events if isinstance(e, ChurnRecord)][-1]
    assert restored["latency_ms"] == 50.0


def test_move_while_a_sip_command_runs_waits_for_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.core.start(rig.now)
    register = rig.sip(rig.commands())
    rig.core.address_changed(rig.now, "127.0.0.3")
    assert rig.commands() == []  # one SIP command at a time
    commands = rig.ok(register)
    assert Rebind("127.0.0.3") in commands and MoveSip("127.0.0.3") in commands


def test_outage_backoff_doubles_then_resets(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    core = rig.core
    core.peer_lost(rig.now, "rudp: 3 messages failed")
    assert core.status is Status.DISCONNECTED and "media_disconnected" in rig.churn()
    reinvite = rig.sip(rig.commands())
    assert isinstance(reinvite, Reinvite)  # at once, with a new key
    delays = []
    command: SipCommand = reinvite
    for _ in range(4):
        core.sip_done(rig.now, command, SipOutcome(status=None, reason="no answer"))
        assert core.state is State.BACKOFF and rig.commands() == []
        timer = core.get_timer()
        assert timer is not None
        delays.append(round(timer - rig.now, 6))
        core.handle_timer(timer - 0.001)
        assert rig.commands() == []  # not yet
        rig.now = timer
        core.handle_timer(rig.now)
        command = rig.sip(rig.commands())
    assert delays == [1.0, 2.0, 4.0, 8.0]  # capped at max
    assert [a.kind for a in rig.events if isinstance(a, Alert)] == ["unreachable"] * 4
    after = rig.ok(command, rig.answer(command.offer))  # type: ignore[union-attr]
    (probe,) = [f for f in rig.frames(after) if isinstance(f, List)]
    core.frame_received(rig.now, encode(Subs(req=probe.req)))
    assert status_of(core) is Status.CONNECTED and core.backoff.attempt == 0
    assert core.counters.failed_attempts == 4


def test_wrong_password_is_an_alert_at_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.core.start(rig.now)
    register = rig.sip(rig.commands())
    rig.core.sip_done(rig.now, register, SipOutcome(status=403, reason="Forbidden"))
    (alert,) = [e for e in rig.events if isinstance(e, Alert)]
    assert alert.kind == "auth" and "403" in alert.message and "password" in alert.message
    assert rig.core.last_error == alert.message and rig.core.counters.auth_failures == 1


def test_nseq_gate_hands_over_once_and_acks_every_copy(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    first = rig.frames(rig.notify(1))
    again = rig.frames(rig.notify(1))
    assert [f.op for f in first] == ["ack"] and first == again
    delivered = [e.record["nseq"] for e in rig.events if isinstance(e, Delivered)]
    assert delivered == [1]
    # What a restart takes: the inbox holds the gate's highest (nseq.json is a checkpoint).
    reopened = open_files(tmp_path)
    assert reopened.nseq.highest == 1
    assert [r["nseq"] for r in reopened.inbox.since(0)] == [1]


def test_new_store_incarnation_resets_gate_and_restores_subscriptions(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect(store="store-1")
    core = rig.core
    req = core.subscribe(rig.now, "news.#", "price < 10", 3600)
    core.frame_received(rig.now, encode(SubOk(req=req, sub_id="7", expires_at=rig.now + 3600)))
    rig.commands()
    for n in (1, 2, 3):
        rig.notify(n)
    # The broker comes back on a new database: the media fails, the re-INVITE's answer
    # names another store.
    core.peer_lost(rig.now, "rudp: 1 messages failed")
    reinvite = rig.sip(rig.commands())
    after = rig.ok(reinvite, rig.answer(reinvite.offer, "store-2"))  # type: ignore[union-attr]
    assert [a.kind for a in rig.events if isinstance(a, Alert)] == ["store_replaced"]
    assert core.store_id == "store-2" and rig.files.nseq.highest == 0
    (probe,) = [f for f in rig.frames(after) if isinstance(f, List)]
    core.frame_received(rig.now, encode(Subs(req=probe.req)))  # the new store has none
    restored = [f for f in rig.frames(rig.commands()) if isinstance(f, Sub)]
    assert [(s.subject, s.filter, s.ttl) for s in restored] == [("news.#", "price < 10", 3600)]
    (told,) = [e for e in rig.events if isinstance(e, StoreReplaced)]
    assert (told.new, told.restored) == ("store-2", 1)
    core.frame_received(rig.now, encode(SubOk(req=restored[0].req, sub_id="1", expires_at=T0)))
    assert [s.sub_id for s in core.subscriptions] == ["1"]
    # The new store's nseq 1 is handed over (the old gate would have dropped it).
    rig.notify(1)
    assert [e.record["nseq"] for e in rig.events if isinstance(e, Delivered)] == [1, 2, 3, 1]
    assert [r["nseq"] for r in rig.files.inbox.since(0)] == [1]
    assert list(tmp_path.glob("inbox.store-1-*.jsonl"))  # the old records are kept aside


def test_deadlines_follow_now_and_the_brokers_times_follow_wall(tmp_path: Path) -> None:
    """``now`` (monotonic) and ``wall`` (epoch) apart, the wall clock an hour back: the
    request deadline is ``now`` + the timeout, a restored fixed subscription's TTL is its
    ``expires_at`` less ``wall``, and the old inbox is archived under ``wall``."""
    rig = Rig(tmp_path)
    rig.connect(store="store-1")
    core = rig.core
    req = core.subscribe(rig.now, "news.#", "", 3600, fixed=True)
    core.frame_received(rig.now, encode(SubOk(req=req, sub_id="7", expires_at=T0 + 3600)))
    rig.commands()
    now, wall = 50.0, T0 - 3600.0  # a monotonic clock's value, and a wall clock set back
    core.peer_lost(now, "rudp: 1 messages failed")
    reinvite = rig.sip(rig.commands())
    answer = rig.answer(reinvite.offer, "store-2")  # type: ignore[union-attr]
    outcome = SipOutcome(status=200, body=answer, call_id="call-1")
    core.sip_done(now, reinvite, outcome, wall=wall)
    (probe,) = [f for f in rig.frames(rig.commands()) if isinstance(f, List)]
    assert core.get_timer() == now + core.response_timeout
    core.frame_received(now, encode(Subs(req=probe.req)), wall=wall)
    (restored,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Sub)]
    assert restored.ttl == 7200
    assert core.get_timer() == now + core.response_timeout
    assert list(tmp_path.glob(f"inbox.store-1-{int(wall)}.jsonl"))


def test_restored_subscriptions_keep_their_queue_class(tmp_path: Path) -> None:
    """The broker's ``subs`` list has no qclass nor in_order: a restore on a new store
    asks for what the agent recorded, so that its notifications keep their class and
    order."""
    rig = Rig(tmp_path)
    rig.connect(store="store-1")
    core = rig.core
    req = core.subscribe(rig.now, "news.#", "price < 10", 3600, qclass="bulk", in_order=True)
    core.frame_received(rig.now, encode(SubOk(req=req, sub_id="7", expires_at=rig.now + 3600)))
    rig.commands()
    # A reconnection to the same store: the probe's list (without qclass) is remembered.
    core.peer_lost(rig.now, "rudp: 1 messages failed")
    reinvite = rig.sip(rig.commands())
    after = rig.ok(reinvite, rig.answer(reinvite.offer, "store-1"))  # type: ignore[union-attr]
    (probe,) = [f for f in rig.frames(after) if isinstance(f, List)]
    listed = SubInfo(sub_id="7", subject="news.#", filter="price < 10", expires_at=rig.now + 3600)
    core.frame_received(rig.now, encode(Subs(req=probe.req, items=(listed,))))
    assert [(s.qclass, s.in_order) for s in SubsRecord(tmp_path / SUBS_FILE).items] == [
        ("bulk", True)
    ]
    # Then the broker comes back on a new database: the restore asks for the same class.
    rig.now += 10
    core.peer_lost(rig.now, "rudp: 1 messages failed")
    reinvite = rig.sip(rig.commands())
    after = rig.ok(reinvite, rig.answer(reinvite.offer, "store-2"))  # type: ignore[union-attr]
    (probe,) = [f for f in rig.frames(after) if isinstance(f, List)]
    core.frame_received(rig.now, encode(Subs(req=probe.req)))
    restored = [f for f in rig.frames(rig.commands()) if isinstance(f, Sub)]
    assert [(s.subject, s.filter, s.ttl, s.qclass, s.in_order) for s in restored] == [
        ("news.#", "price < 10", 3600, "bulk", True)  # a lease asks its own TTL again
    ]
    core.frame_received(
        rig.now, encode(SubOk(req=restored[0].req, sub_id="1", expires_at=rig.now + 3590))
    )
    assert [(s.sub_id, s.qclass) for s in rig.files.subs.items] == [("1", "bulk")]


def test_outbox_is_replayed_after_connection_with_the_same_msg_id(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    core = rig.core
    msg_id, req = core.publish(rig.now, "news.a", {"k": 1}, b"p")
    assert req is None and len(rig.files.outbox) == 1
    rig.connect()
    # connect() answered the probe: the buffered publish went out right after.
    (pub,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    assert pub.msg_id == msg_id and pub.payload == b"p"
    core.frame_received(rig.now, encode(PubOk(req=pub.req, msg_id=msg_id, matched=1)))
    assert len(rig.files.outbox) == 0
    assert RequestDone(pub.req, PubOk(req=pub.req, msg_id=msg_id, matched=1)) in rig.events


def test_a_request_without_answer_fails_at_its_deadline(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    core = rig.core
    _, req = core.publish(rig.now, "news.a")
    assert req is not None
    deadline = core.get_timer()
    assert deadline is not None and deadline > rig.now
    core.handle_timer(deadline)
    (failed,) = [e for e in rig.events if isinstance(e, RequestFailed)]
    assert failed.req == req and len(rig.files.outbox) == 1  # kept for the next connection


def _sent_pub(rig: Rig) -> Pub:
    """The one publish the core sent after its outbox's fsync."""
    rig.core.sync_outbox(rig.now)
    (pub,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    return pub


def _reconnect(rig: Rig) -> list[Command]:
    """The media path is lost and found again (re-INVITE, probe answered): the commands
    of the new connection."""
    rig.core.peer_lost(rig.now, "rudp: 3 messages failed")
    reinvite = rig.sip(rig.commands())
    after = rig.ok(reinvite, rig.answer(reinvite.offer))  # type: ignore[union-attr]
    (probe,) = [f for f in rig.frames(after) if isinstance(f, List)]
    rig.core.frame_received(rig.now, encode(Subs(req=probe.req)))
    assert status_of(rig.core) is Status.CONNECTED
    return rig.commands()


@pytest.mark.parametrize("code", [400, 500, 503])
def test_a_refused_publish_leaves_the_outbox_and_is_not_sent_again(
    tmp_path: Path, code: int
) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    rig.commands()
    rig.core.publish(rig.now, "news.a", {}, b"p")
    pub = _sent_pub(rig)
    refusal = Error(code=code, message="refused", req=pub.req)
    rig.core.frame_received(rig.now, encode(refusal))
    assert RequestDone(pub.req, refusal) in rig.events  # the application is told
    assert len(rig.files.outbox) == 0
    assert not [f for f in rig.frames(_reconnect(rig)) if isinstance(f, Pub)]


@pytest.mark.parametrize(("code", "kept"), [(400, False), (503, True)])
def test_a_publish_told_pending_stays_on_a_temporary_refusal(
    tmp_path: Path, code: int, kept: bool
) -> None:
    """Nobody awaits a buffered publish's answer (the application was told it is
    pending): a temporary refusal keeps it; a final one drops it."""
    rig = Rig(tmp_path)
    msg_id, req = rig.core.publish(rig.now, "news.a", {}, b"p")
    assert req is None
    rig.connect()
    (pub,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    rig.core.frame_received(rig.now, encode(Error(code=code, message="no", req=pub.req)))
    assert [p.msg_id for p in rig.files.outbox.pending()] == ([msg_id] if kept else [])
    again = [f.msg_id for f in rig.frames(_reconnect(rig)) if isinstance(f, Pub)]
    assert again == ([msg_id] if kept else [])


def test_a_publish_kept_on_a_temporary_refusal_goes_again_in_the_same_connection(
    tmp_path: Path,
) -> None:
    """A publisher may hear nothing else from the broker: a timer sends it again."""
    rig = Rig(tmp_path)
    msg_id, _ = rig.core.publish(rig.now, "news.a", {}, b"p")
    rig.connect()
    (pub,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    rig.core.frame_received(rig.now, encode(Error(code=503, message="busy", req=pub.req)))
    assert not [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    due = rig.core.get_timer()
    assert due is not None and due == rig.now + RESEND_AFTER
    rig.core.handle_timer(due - 0.001)
    assert not [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    rig.now = due
    rig.core.handle_timer(rig.now)
    (again,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    assert again.msg_id == msg_id and again.req != pub.req
    rig.core.frame_received(rig.now, encode(PubOk(req=again.req, msg_id=msg_id, matched=1)))
    assert len(rig.files.outbox) == 0


def test_a_publish_whose_wait_ended_stays_on_a_temporary_refusal(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    rig.commands()
    msg_id, req = rig.core.publish(rig.now, "news.a", {}, b"p")
    pub = _sent_pub(rig)
    assert req == pub.req
    rig.core.stop_awaiting(pub.req)  # the application was told "sent"
    rig.core.frame_received(rig.now, encode(Error(code=503, message="busy", req=pub.req)))
    assert [p.msg_id for p in rig.files.outbox.pending()] == [msg_id]


def _unanswered_pub(rig: Rig) -> tuple[str, Pub]:
    """A publish sent while CONNECTED whose answer did not come by its deadline (the
    clock is then at the deadline): its msg_id and its frame."""
    rig.connect()
    rig.commands()
    msg_id, _ = rig.core.publish(rig.now, "news.a", {}, b"p")
    pub = _sent_pub(rig)
    deadline = rig.core.get_timer()
    assert deadline is not None
    rig.now = deadline
    rig.core.handle_timer(rig.now)
    assert [e.req for e in rig.events if isinstance(e, RequestFailed)] == [pub.req]
    assert [p.msg_id for p in rig.files.outbox.pending()] == [msg_id]
    assert not [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    return msg_id, pub


def test_a_publish_without_answer_keeps_its_msg_id_and_goes_again_when_the_broker_answers(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    msg_id, pub = _unanswered_pub(rig)
    # Still CONNECTED; a frame from the broker shows it answers again.
    again = [f for f in rig.frames(rig.notify(1)) if isinstance(f, Pub)]
    assert [(p.msg_id, p.payload) for p in again] == [(msg_id, b"p")]
    assert again[0].req != pub.req
    ok = PubOk(req=again[0].req, msg_id=msg_id, matched=1)
    rig.core.frame_received(rig.now, encode(ok))
    assert len(rig.files.outbox) == 0
    assert not [f for f in rig.frames(_reconnect(rig)) if isinstance(f, Pub)]


def test_a_publish_without_answer_goes_again_on_a_timer_when_the_broker_is_silent(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    msg_id, pub = _unanswered_pub(rig)
    resend = rig.core.get_timer()
    assert resend == rig.now + RESEND_AFTER
    rig.core.handle_timer(resend - 0.001)
    assert not [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    rig.core.handle_timer(resend)
    (again,) = [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)]
    assert again.msg_id == msg_id and again.req != pub.req


def test_an_answer_without_key_exchange_fails_closed(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.core.start(rig.now)
    invite = rig.sip(rig.ok(rig.sip(rig.commands())))
    assert isinstance(invite, Invite)
    after = rig.ok(invite, rig.answer(invite.offer, new_keys=False))
    assert not [c for c in after if isinstance(c, AttachMedia)]  # no media on no keys
    (alert,) = [e for e in rig.events if isinstance(e, Alert)]
    assert alert.kind == "key" and "mdeci-kx" in alert.message
    assert state_of(rig.core) is State.BACKOFF
    timer = rig.core.get_timer()
    assert timer is not None
    rig.now = timer
    rig.core.handle_timer(rig.now)
    again = rig.sip(rig.commands())
    assert isinstance(again, Reinvite)
    # The next attempt offers a new value.
    assert parse_session(again.offer).key != parse_session(invite.offer).key


def test_a_rekey_after_media_loss_offers_a_new_value(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.connect()
    offered = rig.secret
    rig.core.peer_lost(rig.now, "rudp: gone")
    reinvite = rig.sip(rig.commands())
    assert isinstance(reinvite, Reinvite)
    after = rig.ok(reinvite, rig.answer(reinvite.offer))
    assert rig.secret is not None and rig.secret != offered
    assert AttachMedia(rig.secret, BROKER_MEDIA) in after


def test_the_key_agreement_binds_the_offer_as_the_stack_sent_it(tmp_path: Path) -> None:
    """pjsua2 sends our offer with an audio line in front (docs/pjsip.md); the broker
    binds what it got, so the core must bind the same bytes (``SipOutcome.offer``)."""
    rig = Rig(tmp_path)
    core = rig.core
    core.start(rig.now)
    invite = rig.sip(rig.ok(rig.sip(rig.commands())))
    assert isinstance(invite, Invite)
    head, sep, rest = invite.offer.decode().partition("m=")
    sent = f"{head}m=audio 9 RTP/AVP 0\r\na=inactive\r\n{sep}{rest}".encode()
    after = rig.ok(invite, rig.answer(sent), offer=sent)
    assert rig.secret is not None and AttachMedia(rig.secret, BROKER_MEDIA) in after
    assert state_of(core) is State.PROBING
