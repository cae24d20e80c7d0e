"""The subscription matcher's index gives what a scan of every entry gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.broker.matcher import CompiledSubscription, SubscriptionMatcher, filter_cost
from mdeci.filters import compile_filter
from mdeci.store.subscriptions import Subscription
from mdeci.subjects import subject_matches

WORDS = st.sampled_from(["a", "b", "c"])
PATTERN_WORDS = st.sampled_from(["a", "b", "c", "*", "#"])
PATTERNS = st.lists(PATTERN_WORDS, min_size=1, max_size=4).map(".".join)
SUBJECTS = st.lists(WORDS, min_size=1, max_size=4).map(".".join)
FILTERS = st.sampled_from(["", "n > 1", "n < 3"])
USERS = st.integers(0, 2)  # a replaced subscription may change hands


def _sub(
    sub_id: int, pattern: str, expires_at: float, filter_text: str = "", user: int | None = None
) -> Subscription:
    uri = f"sip:u{sub_id % 3 if user is None else user}@x"
    return Subscription(sub_id, uri, pattern, filter_text, 0.0, expires_at)


def _scan(
    subs: dict[int, Subscription], subject: str, attrs: dict[str, int], now: float
) -> tuple[list[tuple[str, int]], list[int]]:
    """The rule of the module docstring, applied to every entry in turn."""
    expired = sorted(i for i, s in subs.items() if s.expires_at <= now)
    targets = []
    for sub_id in sorted(subs):
        sub = subs[sub_id]
        if sub.expires_at > now and subject_matches(sub.subject, subject):
            compiled = CompiledSubscription.compile(sub)
            if compiled.accepts(attrs):
                targets.append((sub.uri, sub_id))
    return targets, expired


# One step: add (or replace) sub_id with a pattern and an expiry, discard it, or match.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 8), PATTERNS, st.integers(1, 20), FILTERS, USERS),
        st.tuples(st.just("discard"), st.integers(1, 8)),
        st.tuples(st.just("match"), SUBJECTS, st.integers(0, 4), st.integers(0, 25)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(STEPS)
def test_the_index_agrees_with_a_scan(steps: list[tuple[object, ...]]) -> None:
    _agrees_with_a_scan(steps)


def _agrees_with_a_scan(steps: list[tuple[object, ...]]) -> None:
    matcher = SubscriptionMatcher()
    model: dict[int, Subscription] = {}
    now = 0.0
    for step in steps:
        if step[0] == "add":
            _, sub_id, pattern, expires, filter_text, user = step
            assert isinstance(sub_id, int) and isinstance(pattern, str)
            assert isinstance(expires, int) and isinstance(filter_text, str)
            assert isinstance(user, int)
            sub = _sub(sub_id, pattern, now + expires, filter_text, user)
            matcher.add(CompiledSubscription.compile(sub))
            model[sub_id] = sub
        elif step[0] == "discard":
            assert isinstance(step[1], int)
            assert (matcher.discard(step[1]) is None) == (step[1] not in model)
            model.pop(step[1], None)
        else:
            _, subject, n, later = step
            assert isinstance(subject, str) and isinstance(n, int) and isinstance(later, int)
            now = max(now, float(later))
            targets, expired = _scan(model, subject, {"n": n}, now)
            result = matcher.match(subject, {"n": n}, now)
            assert list(result.targets) == targets
            assert list(result.expired) == expired
            for sub_id in expired:
                del model[sub_id]
        assert len(matcher) == len(model)
        assert all(sub_id in matcher for sub_id in model)
        for uri in {s.uri for s in model.values()} | {"sip:u0@x"}:
            live = sum(1 for s in model.values() if s.uri == uri and s.expires_at > now)
            assert matcher.count_of(uri, now) == live


def test_a_replaced_subscription_keeps_only_its_new_pattern_and_expiry() -> None:
    matcher = SubscriptionMatcher()
    matcher.add(CompiledSubscription.compile(_sub(1, "a.b", 5.0)))
    matcher.add(CompiledSubscription.compile(_sub(1, "a.*", 50.0)))
    assert matcher.match("a.b", {}, 1.0).targets == (("sip:u1@x", 1),)
    assert matcher.match("a.c", {}, 1.0).targets == (("sip:u1@x", 1),)
    # The first expiry (5) is stale: nothing expires before 50.
    assert matcher.match("a.c", {}, 10.0).expired == ()
    assert matcher.match("a.c", {}, 50.0).expired == (1,)
    assert len(matcher) == 0


def test_a_user_with_one_subscription_costs_no_tuple_of_ids_or_of_expiry() -> None:
    """A broker holds a subscription per device: its index entries are what it holds."""
    matcher = SubscriptionMatcher()
    one = CompiledSubscription.compile(_sub(1, "a.b", 5.0, user=7))
    matcher.add(one)
    assert matcher._by_uri == {"sip:u7@x": 1} and matcher._expiry == [one]
    two = CompiledSubscription.compile(_sub(2, "a.c", 6.0, user=7))
    matcher.add(two)
    assert matcher._by_uri == {"sip:u7@x": (1, 2)} and matcher.count_of("sip:u7@x", 0.0) == 2
    matcher.discard(1)
    assert matcher._by_uri == {"sip:u7@x": 2} and matcher.count_of("sip:u7@x", 0.0) == 1
    assert matcher.match("a.c", {}, 6.0).expired == (2,) and not matcher._by_uri


def test_load_replaces_everything() -> None:
    matcher = SubscriptionMatcher()
    matcher.add(CompiledSubscription.compile(_sub(1, "a", 5.0)))
    matcher.load([_sub(2, "b", 9.0), _sub(3, "a..b", 9.0)])
    assert 1 not in matcher and len(matcher) == 1
    assert [s.sub_id for s in matcher.unusable] == [3]
    assert matcher.match("a", {}, 1.0).targets == ()
    assert matcher.match("b", {}, 9.0).expired == (2,)


# Few patterns and subjects, so that one subject is matched again and again between the
# changes: the cached targets of a subject (SubscriptionMatcher._plain) must follow every
# add, replacement, discard and expiry, and give way to filters and wildcards.
FEW_STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(1, 5),
            st.sampled_from(["a", "a.b", "a.*", "#"]),
            st.integers(1, 20),
            st.sampled_from(["", "", "", "n > 1"]),
            USERS,
        ),
        st.tuples(st.just("discard"), st.integers(1, 5)),
        st.tuples(
            st.just("match"), st.sampled_from(["a", "a.b"]), st.integers(0, 4), st.integers(0, 25)
        ),
        st.tuples(
            st.just("match"), st.sampled_from(["a", "a.b"]), st.integers(0, 4), st.integers(0, 25)
        ),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(FEW_STEPS)
def test_the_cached_targets_of_a_subject_agree_with_a_scan(steps: list[tuple[object, ...]]) -> None:
    _agrees_with_a_scan(steps)


def test_the_cached_targets_follow_adds_filters_wildcards_and_expiry() -> None:
    matcher = SubscriptionMatcher()

    def targets(n: int = 0, now: float = 0.0) -> list[int]:
        return [sub_id for _, sub_id in matcher.match("a.b", {"n": n}, now).targets]

    matcher.add(CompiledSubscription.compile(_sub(1, "a.b", 10.0)))
    assert targets() == [1]
    assert targets() == [1]  # the second time from the cache
    matcher.add(CompiledSubscription.compile(_sub(2, "a.b", 20.0)))
    assert targets() == [1, 2]
    matcher.add(CompiledSubscription.compile(_sub(3, "a.b", 20.0, "n > 1")))
    assert targets(n=0) == [1, 2]
    assert targets(n=2) == [1, 2, 3]
    matcher.discard(3)
    assert targets(n=2) == [1, 2]
    matcher.add(CompiledSubscription.compile(_sub(4, "a.*", 20.0, "n > 1")))
    assert targets(n=0) == [1, 2]
    assert targets(n=2) == [1, 2, 4]
    matcher.discard(4)
    assert targets() == [1, 2]
    assert targets(now=15.0) == [2]  # 1 expired


@pytest.mark.parametrize(
    ("text", "cost"),
    [
        ("", 1),  # still called
        ("a == 1", 1),
        ("a == 1 and b > 2", 3),
        ("a == 1 or b == 2 or c == 3", 4),  # one Or of three
        ("not (a == 1 and exists(b)) or prefix(s, 'x')", 6),
    ],
)
def test_a_filter_costs_the_nodes_it_evaluates_at_most(text: str, cost: int) -> None:
    assert filter_cost(compile_filter(text).expr) == cost


def test_the_cost_refusal_counts_only_the_users_live_subscriptions() -> None:
    matcher = SubscriptionMatcher()
    three = compile_filter("a == 1 and b > 2")
    matcher.add(CompiledSubscription.compile(_sub(1, "#", 10.0, three.text, user=0)))
    matcher.add(CompiledSubscription.compile(_sub(2, "#", 20.0, three.text, user=0)))
    matcher.add(CompiledSubscription.compile(_sub(3, "#", 20.0, three.text, user=1)))
    uri = "sip:u0@x"
    assert matcher.cost_refusal(uri, three, 9, 0.0) is None  # 3 + 3 + 3
    refused = matcher.cost_refusal(uri, three, 8, 0.0)
    assert refused is not None and "costs 3" in refused and "subscriptions 6" in refused
    assert matcher.cost_refusal(uri, three, 6, 15.0) is None  # the first one expired


def test_an_entry_is_its_row_compiled_in_one_object() -> None:
    """A broker holds an entry per session: it is the stored row itself with the
    compiled filter, and a pattern without wildcards keeps no matcher object."""
    exact = CompiledSubscription.compile(_sub(1, "a.b", 5.0, "n > 1", user=0))
    assert isinstance(exact, Subscription) and exact.exact and exact.matcher is None
    assert (exact.sub_id, exact.uri, exact.subject, exact.filter) == (1, "sip:u0@x", "a.b", "n > 1")
    assert exact.matches("a.b") and not exact.matches("a.c")
    assert exact.accepts({"n": 2}) and not exact.accepts({"n": 1})
    wild = CompiledSubscription.compile(_sub(2, "a.*", 5.0))
    assert wild.matcher is not None and wild.matches("a.c") and not wild.matches("b.c")
    later = CompiledSubscription.of(_sub(2, "a.*", 9.0), wild.matcher, wild.accepts)
    assert later.expires_at == 9.0 and later.matcher is wild.matcher and wild < later
