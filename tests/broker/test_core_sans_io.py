"""The broker's sans-IO core driven by hand: a fake clock and scripted store results,
no store and no socket. Each step's store commands are read as the glue would carry
them out, and each result is sent back (or a StoreError thrown in)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mdeci.broker import BrokerCoreConfig, MemorySink
from mdeci.broker.core import (
    ActiveSubscriptions,
    AddSubscription,
    BrokerCore,
    PublishMany,
    RenewSubscription,
    StoreFailed,
    StoreSucceeded,
    SweepExpired,
)
from mdeci.broker.delivery import (
    AckMany,
    MissedMany,
    PendingMany,
    Step,
    StoreCommand,
    TakeMissed,
    Wake,
)
from mdeci.config import QueueConfig
from mdeci.errors import StoreError, StoreUnavailable
from mdeci.frames import (
    Ack,
    Error,
    Frame,
    List,
    Notify,
    Pub,
    PubOk,
    Renew,
    Sub,
    SubOk,
    Subs,
    decode,
)
from mdeci.store.queue_rows import Enqueued, PublishResult, StoredRow
from mdeci.store.subscription_rows import Subscription
from tests.broker.conftest import T0, FakeClock
from tests.broker.core_helpers import ALICE, BOB, PUBLISHER

Answer = Callable[[StoreCommand[Any]], object]


def drive(step: Step[Any], *answers: Answer) -> tuple[Any, list[StoreCommand[Any]]]:
    """Run ``step`` to its end, answering its n-th command with ``answers[n]`` (a
    StoreError it returns is thrown in); its answer and the commands it gave."""
    commands: list[StoreCommand[Any]] = []
    try:
        command = next(step)
        while True:
            commands.append(command)
            assert len(commands) <= len(answers), f"unexpected store command {command!r}"
            result = answers[len(commands) - 1](command)
            failed = result if isinstance(result, StoreError) else None
            command = step.send(result) if failed is None else step.throw(failed)
    except StopIteration as stop:
        assert len(commands) == len(answers), commands
        return stop.value, commands


def returns(value: object) -> Answer:
    return lambda _command: value


def sub(sub_id: int, uri: str, subject: str) -> Subscription:
    return Subscription(sub_id, uri, subject, "", T0, T0 + 3600.0)


def loaded(clock: FakeClock, *subs: Subscription, window: int = 256) -> BrokerCore:
    config = BrokerCoreConfig(queue=QueueConfig(window=window))
    core = BrokerCore(config, clock, MemorySink())
    _, commands = drive(core.load(), returns(list(subs)))
    assert commands == [ActiveSubscriptions(T0)]
    return core


def published(command: StoreCommand[Any]) -> tuple[list[PublishResult], list[StoredRow]]:
    """What the store answers a PublishMany: every target queued, nseqs from 1 per user."""
    assert isinstance(command, PublishMany)
    results: list[PublishResult] = []
    written: list[StoredRow] = []
    nseq: dict[str, int] = {}
    for req in command.requests:
        queued = []
        for uri, sub_id in req.targets:
            nseq[uri] = nseq.get(uri, 0) + 1
            queued.append(Enqueued(uri, nseq[uri], sub_id, nseq[uri]))
            written.append(
                (uri, nseq[uri], sub_id, req.publisher_uri, req.msg_id, req.subject,
                 req.attrs_cbor, req.payload, req.urgent, req.published_at, req.qclass)
            )  # fmt: skip
        results.append(PublishResult(len(req.targets), False, tuple(queued)))
    return results, written


def pub(req: int) -> Pub:
    return Pub(req=req, msg_id=f"m{req}", subject="news.a", payload=b"p")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_a_batch_of_publishes_is_one_store_command_and_pub_ok_comes_after_its_result(
    clock: FakeClock,
) -> None:
    core = loaded(clock, sub(1, ALICE, "news.*"), sub(2, BOB, "news.a"))
    step = core.handle_decoded([(PUBLISHER, pub(i)) for i in range(1, 51)])
    command = next(step)  # nothing is answered before the store's result
    assert isinstance(command, PublishMany)
    assert len(command.requests) == 50
    assert command.requests[0].targets == ((ALICE, 1), (BOB, 2))
    assert core.published == 0
    with pytest.raises(StopIteration) as done:
        step.send(published(command))
    replies: list[list[Frame]] = done.value.value
    assert replies == [[PubOk(req=i, msg_id=f"m{i}", matched=2)] for i in range(1, 51)]
    assert core.published == 50
    assert core.events == [Wake("queued", ALICE), Wake("queued", BOB)]
    assert core.health_events == [StoreSucceeded()]


def test_a_failed_publish_is_refused_and_its_targets_are_woken(clock: FakeClock) -> None:
    core = loaded(clock, sub(1, ALICE, "news.*"))
    failure = StoreUnavailable("publish failed: server closed the connection")
    replies, commands = drive(core.handle_decoded([(PUBLISHER, pub(1))]), returns(failure))
    assert [type(c) for c in commands] == [PublishMany]
    (reply,) = replies[0]
    assert isinstance(reply, Error) and reply.code == 503 and reply.req == 1
    assert core.published == 0
    # The rows may be committed all the same: the target reads its queue again.
    assert core.events == [Wake("queued", ALICE)]
    assert core.health_events == [StoreFailed("publish", failure)]


def test_a_subscription_is_added_only_with_the_stores_answer(clock: FakeClock) -> None:
    core = loaded(clock)
    stored = sub(7, ALICE, "news.*")
    replies, commands = drive(
        core.handle(ALICE, Sub(req=3, subject="news.*", ttl=60)), returns(stored)
    )
    assert commands == [AddSubscription(ALICE, "news.*", "", 60.0, T0, None)]
    assert replies == [SubOk(req=3, sub_id="7", expires_at=stored.expires_at, ttl=60.0)]
    assert core.matcher.get(7) is not None
    # Refused before any store command: an unknown queue class changes nothing.
    replies, commands = drive(core.handle(ALICE, Sub(req=4, subject="x", qclass="nope")))
    assert commands == [] and isinstance(replies[0], Error) and replies[0].code == 400


def test_a_connected_user_is_served_from_the_store_then_from_memory(clock: FakeClock) -> None:
    core = loaded(clock, sub(1, ALICE, "news.*"))
    drive(core.mark_connected(ALICE, ("10.0.0.1", 5000)))
    # First take: the queue is read, and the missed count taken once (a new connection).
    taken, commands = drive(core.take_batches([ALICE]), returns([[]]))
    assert commands == [PendingMany([(ALICE, 0, 256)])]
    assert taken == {}
    # A publish now hands its row on from memory: the next take needs no store command.
    clock.advance(1.0)
    _, commands = drive(core.handle_decoded([(PUBLISHER, pub(1))]), published)
    taken, commands = drive(core.take_batches([ALICE]), returns(0))
    assert commands == [TakeMissed(ALICE)]
    (notify,) = taken[ALICE]
    frame = decode(notify.data)
    assert isinstance(frame, Notify) and (frame.nseq, frame.msg_id) == (1, "m1")
    assert frame.published_at == T0 + 1.0
    assert core.in_flight(ALICE) == (1,)


def test_acks_are_held_and_applied_once_per_batch(clock: FakeClock) -> None:
    core = loaded(clock, sub(1, ALICE, "news.*"))
    drive(core.mark_connected(ALICE, ("10.0.0.1", 5000)))
    drive(core.take_batches([ALICE]), returns([[]]))
    drive(core.handle_decoded([(PUBLISHER, pub(i)) for i in (1, 2, 3)]), published)
    taken, _ = drive(core.take_batches([ALICE]), returns(0))
    assert [n.nseq for n in taken[ALICE]] == [1, 2, 3]
    clock.advance(0.25)
    core.events.clear()
    # Three acks in one batch: the stream is idle after them, so one AckMany (the
    # highest) at the end of the batch, and one wake-up.
    acks = [(ALICE, Ack(upto=n)) for n in (1, 2, 3)]
    replies, commands = drive(core.handle_decoded(acks), returns([3]))
    assert replies == [[], [], []]
    assert commands == [AckMany([(ALICE, 3)])]
    assert core.events == [Wake("acked", ALICE)]
    assert core.in_flight(ALICE) == ()
    assert isinstance(core.log, MemorySink)
    delivered = core.log.named("notify_delivered")
    assert [(e.fields["nseq"], e.fields["latency_ms"]) for e in delivered] == [
        (1, 250.0),
        (2, 250.0),
        (3, 250.0),
    ]


def test_a_failed_ack_stays_held_and_is_applied_with_the_next_one(clock: FakeClock) -> None:
    core = loaded(clock)
    failure = StoreUnavailable("ack failed")
    _, commands = drive(core.handle_decoded([(ALICE, Ack(upto=4))]), returns(failure))
    assert commands == [AckMany([(ALICE, 4)])]
    _, commands = drive(core.flush_acks(ALICE), returns([4]))
    assert commands == [AckMany([(ALICE, 4)])]
    _, commands = drive(core.flush_acks(ALICE))
    assert commands == []  # applied: nothing held any more


def test_an_acking_user_is_refilled_in_the_same_call(clock: FakeClock) -> None:
    core = loaded(clock, sub(1, ALICE, "news.*"), window=2)
    drive(core.mark_connected(ALICE, ("10.0.0.1", 5000)))
    drive(core.take_batches([ALICE]), returns([[]]))
    drive(core.handle_decoded([(PUBLISHER, pub(i)) for i in (1, 2, 3)]), published)
    taken, _ = drive(core.take_batches([ALICE]), returns(0))
    assert [n.nseq for n in taken[ALICE]] == [1, 2]
    core.events.clear()
    # The ack frees the window: the same step gives the next notify (from memory), and
    # no wake-up (the caller sends it itself).
    (replies, more), commands = drive(
        core.handle_and_take([(ALICE, Ack(upto=2))], {ALICE}), returns([2])
    )
    assert commands == [AckMany([(ALICE, 2)])]
    assert replies == [[]]
    assert [n.nseq for n in more[ALICE]] == [3]
    assert core.events == []


def test_a_publish_to_an_expired_subscription_sweeps_it(clock: FakeClock) -> None:
    core = loaded(clock, Subscription(1, ALICE, "news.*", "", T0, T0 + 10.0))
    clock.advance(10.0)
    gone = Subscription(1, ALICE, "news.*", "", T0, T0 + 10.0)
    replies, commands = drive(
        core.handle_decoded([(PUBLISHER, pub(1))]), published, returns([gone])
    )
    assert [type(c) for c in commands] == [PublishMany, SweepExpired]
    assert replies == [[PubOk(req=1, msg_id="m1", matched=0)]]
    assert core.matcher.get(1) is None


def test_a_user_whose_missed_count_fails_is_left_out_and_the_others_served(
    clock: FakeClock,
) -> None:
    core = loaded(clock, sub(1, ALICE, "news.*"), sub(2, BOB, "news.*"))
    for uri in (ALICE, BOB):
        drive(core.mark_connected(uri, ("10.0.0.1", 5000)))
    drive(core.take_batches([ALICE, BOB]), returns([[], []]))
    drive(core.handle_decoded([(PUBLISHER, pub(1))]), published)
    # Both are new connections: one read of the counts for both, then a take for the
    # one with drops, which fails: Alice is left out unchanged, Bob is served.
    failure = StoreUnavailable("take_missed failed")
    taken, commands = drive(core.take_batches([ALICE, BOB]), returns({ALICE: 3}), returns(failure))
    assert commands == [MissedMany([ALICE, BOB]), TakeMissed(ALICE)]
    assert list(taken) == [BOB] and core.in_flight(ALICE) == ()
    taken, commands = drive(core.take_batches([ALICE]), returns(3))
    assert commands == [TakeMissed(ALICE)]
    frame = decode(taken[ALICE][0].data)
    assert isinstance(frame, Notify) and (frame.nseq, frame.missed) == (1, 3)


def test_a_renewal_moves_the_expiry_the_store_answers(clock: FakeClock) -> None:
    core = loaded(clock, sub(1, ALICE, "news.*"))
    clock.advance(100.0)
    renewed = Subscription(1, ALICE, "news.*", "", T0, T0 + 100.0 + 600.0)
    replies, commands = drive(
        core.handle(ALICE, Renew(req=5, sub_id="1", ttl=600)), returns(renewed)
    )
    assert commands == [RenewSubscription(ALICE, 1, 600.0, T0 + 100.0)]
    assert replies == [SubOk(req=5, sub_id="1", expires_at=T0 + 700.0, ttl=600.0)]
    cached = core.matcher.get(1)
    assert cached is not None and cached.expires_at == T0 + 700.0
    # The store has no live one of that id: 404, the matcher unchanged.
    replies, _ = drive(core.handle(ALICE, Renew(req=6, sub_id="1", ttl=600)), returns(None))
    assert isinstance(replies[0], Error) and replies[0].code == 404


def test_a_list_is_a_read_and_a_subscription_a_write_for_the_stores_health(
    clock: FakeClock,
) -> None:
    """A full disk still reads: a ``list`` the store answered must not end its outage."""
    core = loaded(clock, sub(1, ALICE, "news.*"))
    core.health_events.clear()
    replies, _ = drive(core.handle(ALICE, List(req=1)), returns([sub(1, ALICE, "news.*")]))
    assert isinstance(replies[0], Subs)
    assert core.health_events == [StoreSucceeded(wrote=False)]
    core.health_events.clear()
    drive(core.handle(ALICE, Sub(req=2, subject="a.*", ttl=60)), returns(sub(2, ALICE, "a.*")))
    assert core.health_events == [StoreSucceeded(wrote=True)]
