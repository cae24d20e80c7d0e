"""Subscriptions with a TTL: alive while now < expires_at."""

from __future__ import annotations

import math

import pytest
from sqlalchemy.engine import Engine

from mdeci.store.errors import InvalidArgument
from mdeci.store.subscriptions import SqlSubscriptionStore, Subscription

ALICE = "sip:alice@example.com"
BOB = "sip:bob@example.com"


def test_add_assigns_ids_and_expiry(engine: Engine) -> None:
    subs = SqlSubscriptionStore(engine)
    a = subs.add_subscription(ALICE, "stock.*", "Price < 25", 60.0, 1000.0)
    b = subs.add_subscription(BOB, "stock.#", "", 30.5, 1000.0)
    assert a == Subscription(a.sub_id, ALICE, "stock.*", "Price < 25", 1000.0, 1060.0)
    assert b.sub_id > a.sub_id and b.expires_at == 1030.5
    assert subs.list_subscriptions(ALICE, 1000.0) == [a]
    assert subs.active_subscriptions(1000.0) == [a, b]
    assert subs.get_subscription(a.sub_id, 1000.0) == a
    assert subs.get_subscription(9999, 1000.0) is None


def test_an_added_subscription_keeps_the_callers_texts(engine: Engine) -> None:
    """The broker's matcher holds the subject and filter it passed: the record shares
    them instead of holding the row's copies (one pair per subscription it keeps)."""
    subject, filter_text = "".join(["stock.", "PETR4"]), "".join(["Price < ", "25"])
    sub = SqlSubscriptionStore(engine).add_subscription(ALICE, subject, filter_text, 60.0, 0.0)
    assert sub.subject is subject and sub.filter is filter_text


@pytest.mark.parametrize("ttl", [0.0, -1.0, math.inf, math.nan])
def test_bad_ttl_is_refused(engine: Engine, ttl: float) -> None:
    subs = SqlSubscriptionStore(engine)
    with pytest.raises(InvalidArgument):
        subs.add_subscription(ALICE, "a", "", ttl, 1000.0)
    assert subs.active_subscriptions(0.0) == []


def test_a_user_removes_only_its_own(engine: Engine) -> None:
    subs = SqlSubscriptionStore(engine)
    a = subs.add_subscription(ALICE, "a", "", 60.0, 0.0)
    assert not subs.remove_subscription(BOB, a.sub_id)
    assert subs.list_subscriptions(ALICE, 0.0) == [a]
    assert subs.remove_subscription(ALICE, a.sub_id)
    assert not subs.remove_subscription(ALICE, a.sub_id)
    assert subs.list_subscriptions(ALICE, 0.0) == []


def test_ids_are_never_reused(engine: Engine) -> None:
    subs = SqlSubscriptionStore(engine)
    first = subs.add_subscription(ALICE, "a", "", 60.0, 0.0)
    last = subs.add_subscription(ALICE, "b", "", 60.0, 0.0)
    assert subs.remove_subscription(ALICE, last.sub_id)
    assert subs.remove_subscription(ALICE, first.sub_id)
    again = subs.add_subscription(ALICE, "c", "", 60.0, 0.0)
    assert again.sub_id > last.sub_id


def test_expiry_at_the_exact_boundary(engine: Engine) -> None:
    subs = SqlSubscriptionStore(engine)
    short = subs.add_subscription(ALICE, "a", "", 10.0, 1000.0)
    long = subs.add_subscription(BOB, "b", "", 20.0, 1000.0)
    # Alive just before expires_at, expired at expires_at itself.
    assert subs.active_subscriptions(1009.999) == [short, long]
    assert subs.active_subscriptions(1010.0) == [long]
    assert subs.list_subscriptions(ALICE, 1010.0) == []
    assert subs.get_subscription(short.sub_id, 1010.0) is None
    assert subs.sweep_expired(1009.999) == []
    assert subs.sweep_expired(1010.0) == [short]
    assert subs.sweep_expired(1010.0) == []
    assert subs.sweep_expired(2000.0) == [long]
    assert subs.active_subscriptions(0.0) == []


def test_renew_moves_a_live_subscriptions_expiry_only(engine: Engine) -> None:
    subs = SqlSubscriptionStore(engine)
    a = subs.add_subscription(ALICE, "stock.*", "Price < 25", 10.0, 1000.0, "bulk")
    renewed = subs.renew_subscription(ALICE, a.sub_id, 30.0, 1008.0)
    assert renewed == Subscription(a.sub_id, ALICE, "stock.*", "Price < 25", 1000.0, 1038.0, "bulk")
    assert subs.list_subscriptions(ALICE, 1020.0) == [renewed]
    assert subs.renew_subscription(BOB, a.sub_id, 30.0, 1009.0) is None  # not Bob's
    assert subs.renew_subscription(ALICE, 9999, 30.0, 1009.0) is None
    with pytest.raises(InvalidArgument):
        subs.renew_subscription(ALICE, a.sub_id, 0.0, 1009.0)
    # At its expiry it is dead, swept or not: never brought back.
    assert subs.renew_subscription(ALICE, a.sub_id, 30.0, 1038.0) is None
    assert subs.get_subscription(a.sub_id, 0.0) == renewed
