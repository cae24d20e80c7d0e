"""Subscription leases end to end without sockets: the agent core's frames go to a real
broker core (SQLite store) and its answers come back, both on one fake clock, with the
broker's default TTL at a few seconds."""

from __future__ import annotations

from pathlib import Path

from mdeci.agent.core import AgentCore
from mdeci.agent.events import Command, Reinvite, SendFrame, SipOutcome, SubscriptionChanged
from mdeci.broker import Broker, MemorySink
from mdeci.config import SubscriptionConfig
from mdeci.frames import List, Pub, PubOk, Renew, Sub, Subs, decode, encode
from mdeci.store.repo import BrokerStore
from tests.agent.test_core import Rig
from tests.broker.conftest import FakeClock, make_broker

ALICE = "sip:alice@localhost"
BOB = "sip:bob@localhost"
TTL = 3.0  # the broker's default TTL


class Link:
    """Alice's core wired to ``broker``: frames go there, answers come back."""

    def __init__(self, tmp: Path, store: BrokerStore) -> None:
        self.rig = Rig(tmp)
        self.clock = FakeClock(self.rig.now)
        self.broker: Broker = make_broker(
            store, self.clock, MemorySink(), subscriptions=SubscriptionConfig(default_ttl=TTL)
        )
        self.sent: list[object] = []  # every frame alice sent the broker
        self.published = 0

    @property
    def core(self) -> AgentCore:
        return self.rig.core

    def pump(self, commands: list[Command]) -> list[Command]:
        """Carry alice's frames to the broker and its answers back; the other commands."""
        others: list[Command] = []
        while commands:
            replies = []
            for command in commands:
                if isinstance(command, SendFrame):
                    self.sent.append(decode(command.data))
                    replies += self.broker.handle_frame(ALICE, command.data)
                else:
                    others.append(command)
            commands = []
            if replies:
                self.rig.core.frames_received(self.rig.now, [encode(r) for r in replies])
                commands = self.rig.commands()
        return others

    def at(self, when: float) -> None:
        self.rig.now = self.clock.now = when

    def advance(self, seconds: float) -> list[Command]:
        """Let ``seconds`` pass, running the core's timer at each of its deadlines."""
        end = self.rig.now + seconds
        others: list[Command] = []
        while (deadline := self.rig.core.get_timer()) is not None and deadline <= end:
            self.at(max(self.rig.now, deadline))
            self.rig.core.handle_timer(self.rig.now)
            others += self.pump(self.rig.commands())
        self.at(end)
        return others

    def subscribe(self, subject: str, filter: str = "", *, fixed: bool = False) -> str:
        if fixed:
            self.rig.core.subscribe(self.rig.now, subject, filter, fixed=True)
        else:  # a lease: the default
            self.rig.core.subscribe(self.rig.now, subject, filter)
        self.pump(self.rig.commands())
        return self.rig.core.subscriptions[-1].sub_id

    def publish(self, subject: str) -> int:
        self.published += 1
        frame = Pub(req=self.published, msg_id=f"m{self.published}", subject=subject)
        (reply,) = self.broker.handle_frame(BOB, encode(frame))
        assert isinstance(reply, PubOk)
        return reply.matched

    def changes(self) -> list[SubscriptionChanged]:
        return [e for e in self.rig.events if isinstance(e, SubscriptionChanged)]


def test_a_lease_outlives_several_ttls_and_a_move_and_still_matches(
    tmp_path: Path, store: BrokerStore
) -> None:
    link = Link(tmp_path, store)
    link.rig.connect()
    sub_id = link.subscribe("news.#")
    link.advance(TTL * 1.5)
    # A move in the middle: REGISTER from the new address, re-INVITE keeping the keys.
    link.core.address_changed(link.rig.now, "127.0.0.3")
    move = link.rig.sip(link.pump(link.rig.commands()))
    link.core.media_bound(link.rig.now, ("127.0.0.3", 4000))
    link.advance(0.3)  # what falls due meanwhile goes on
    reinvite = link.rig.sip(link.pump(link.rig.ok(move, local_addr=("127.0.0.3", 5070))))
    assert isinstance(reinvite, Reinvite)
    link.advance(0.2)
    link.pump(link.rig.ok(reinvite, link.rig.answer(reinvite.offer, new_keys=False)))
    assert link.core.connected and link.core.sip_addr == ("127.0.0.3", 5070)
    link.advance(TTL * 3)  # four TTLs in all
    assert link.publish("news.a") == 1
    renewals = [f for f in link.sent if isinstance(f, Renew)]
    assert len(renewals) >= 5 and {f.sub_id for f in renewals} == {sub_id}
    assert link.changes() == []
    assert [s.sub_id for s in link.core.subscriptions] == [sub_id]


def test_a_lease_with_its_own_ttl_is_renewed_with_it(tmp_path: Path, store: BrokerStore) -> None:
    # `mdeci sub X --ttl 3` on a broker whose default is an hour, then a publish 4 s later
    # and more: it still matches, each renewal asking for the 3 s first asked.
    link = Link(tmp_path, store)
    link.broker = make_broker(store, link.clock, MemorySink())
    link.rig.connect()
    link.core.subscribe(link.rig.now, "news.#", ttl=3)
    link.pump(link.rig.commands())
    (sub,) = link.core.subscriptions
    assert sub.expires_at == link.rig.now + 3
    link.advance(4.0)
    assert link.publish("news.a") == 1
    link.advance(9.0)
    assert link.publish("news.a") == 1
    renewals = [f for f in link.sent if isinstance(f, Renew)]
    assert len(renewals) >= 5 and {(f.sub_id, f.ttl) for f in renewals} == {(sub.sub_id, 3)}
    assert link.changes() == []


def test_a_refused_renewal_ends_the_subscription_and_says_so(
    tmp_path: Path, store: BrokerStore
) -> None:
    link = Link(tmp_path, store)
    link.rig.connect()
    sub_id = link.subscribe("news.#", filter="x > 1")
    # Removed at the broker behind the agent's back: the next renewal is refused.
    assert store.subscriptions.remove_subscription(ALICE, int(sub_id))
    link.advance(TTL)
    (ended,) = link.changes()
    assert (ended.sub_id, ended.state, ended.subject, ended.filter) == (
        sub_id,
        "ended",
        "news.#",
        "x > 1",
    )
    assert ended.reason.startswith("renewal refused: 404")
    assert link.core.subscriptions == ()
    (state,) = link.core.subs.states()
    assert (state.sub_id, state.state, state.reason) == (sub_id, "ended", ended.reason)
    link.advance(TTL * 2)
    assert len(link.changes()) == 1 and [f for f in link.sent if isinstance(f, Sub)][1:] == []


def test_a_fixed_subscription_ends_at_its_ttl_unrenewed(tmp_path: Path, store: BrokerStore) -> None:
    link = Link(tmp_path, store)
    link.rig.connect()
    sub_id = link.subscribe("news.#", fixed=True)
    link.advance(TTL - 0.01)
    assert link.publish("news.a") == 1 and link.changes() == []
    link.advance(0.01)
    (ended,) = link.changes()
    assert (ended.sub_id, ended.state, ended.reason, ended.lease) == (
        sub_id,
        "ended",
        "TTL reached",
        False,
    )
    assert link.publish("news.a") == 0
    assert [f for f in link.sent if isinstance(f, Renew)] == []
    assert link.core.subscriptions == ()


def test_a_lease_lapsed_in_an_outage_is_subscribed_again(
    tmp_path: Path, store: BrokerStore
) -> None:
    link = Link(tmp_path, store)
    link.rig.connect()
    old = link.subscribe("news.#")
    link.core.peer_lost(link.rig.now, "rudp: 1 messages failed")
    reinvite = link.rig.sip(link.rig.commands())
    link.advance(TTL * 2)  # no renewal offline; the broker sweeps the lapsed one
    link.broker.sweep()
    assert [f for f in link.sent if isinstance(f, Renew)] == []
    assert link.publish("news.a") == 0
    after = link.rig.ok(reinvite, link.rig.answer(reinvite.offer))  # type: ignore[union-attr]
    link.pump(after)  # the probe's list (empty) goes to the broker and back
    assert link.core.connected
    (again,) = link.changes()
    assert again.state == "live" and again.replaces == old and again.sub_id != old
    assert [s.sub_id for s in link.core.subscriptions] == [again.sub_id]
    assert link.publish("news.a") == 1
    link.advance(TTL * 2)
    assert link.publish("news.a") == 1  # and renewed from then on
    renewed = {f.sub_id for f in link.sent if isinstance(f, Renew)}
    assert renewed == {again.sub_id}


def test_a_lease_lives_on_over_a_broker_restart(tmp_path: Path, store: BrokerStore) -> None:
    link = Link(tmp_path, store)
    link.rig.connect()
    sub_id = link.subscribe("news.#")
    link.advance(TTL / 3)
    # The broker dies; its renewal falls due while alice cannot reach it.
    link.core.peer_lost(link.rig.now, "rudp: the broker stopped answering keepalives")
    reinvite = link.rig.sip(link.rig.commands())
    link.core.sip_done(link.rig.now, reinvite, SipOutcome(status=None, reason="no answer"))
    link.advance(TTL / 2)
    assert [f for f in link.sent if isinstance(f, Renew)] == []
    # A new broker on the same store reaches her: her probe, then the due renewal.
    link.broker = make_broker(
        store, link.clock, MemorySink(), subscriptions=SubscriptionConfig(default_ttl=TTL)
    )
    assert link.core.broker_restarted(link.rig.now)
    link.pump(link.rig.commands())
    assert link.core.connected
    assert [f.sub_id for f in link.sent if isinstance(f, Renew)] == [sub_id]
    link.advance(TTL * 3)
    assert link.publish("news.a") == 1
    assert link.changes() == [] and [s.sub_id for s in link.core.subscriptions] == [sub_id]
    assert len([f for f in link.sent if isinstance(f, Renew)]) >= 4


def test_a_restarted_agent_renews_the_leases_of_its_record(
    tmp_path: Path, store: BrokerStore
) -> None:
    link = Link(tmp_path, store)
    link.rig.connect()
    lease = link.subscribe("news.#")
    fixed = link.subscribe("sports.#", fixed=True)
    link.advance(1.0)
    link.rig.files.close()
    # A new agent on the same state folder; its probe's list comes from the broker.
    again = Link(tmp_path, store)
    again.broker, again.clock = link.broker, link.clock
    again.at(link.rig.now)
    listed = link.broker.handle_frame(ALICE, encode(List(req=1)))[0]
    assert isinstance(listed, Subs)
    again.rig.connect(subs=listed.items)
    assert [(s.sub_id, s.lease) for s in again.rig.files.subs.items] == [
        (lease, True),
        (fixed, False),
    ]
    again.advance(TTL * 3)
    assert {f.sub_id for f in again.sent if isinstance(f, Renew)} == {lease}
    assert again.publish("news.a") == 1 and again.publish("sports.a") == 0
    (ended,) = again.changes()
    assert (ended.sub_id, ended.reason) == (fixed, "TTL reached")


def test_a_renewal_that_reaches_the_broker_too_late_subscribes_again(
    tmp_path: Path, store: BrokerStore
) -> None:
    link = Link(tmp_path, store)
    link.rig.connect()
    old = link.subscribe("news.#")
    deadline = link.core.get_timer()
    assert deadline is not None
    link.at(deadline)
    link.core.handle_timer(link.rig.now)
    delayed = link.rig.commands()  # the renew, held on the path past the expiry
    link.at(link.rig.now + TTL)
    link.pump(delayed)
    (again,) = link.changes()
    assert (again.state, again.replaces) == ("live", old)
    assert again.reason.startswith("expired before a renewal reached the broker")
    assert link.publish("news.a") == 1
