"""Subjects and AMQP-style subscription patterns (``*`` one word, ``#`` zero or more)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.errors import SubjectError
from mdeci.subjects import (
    MAX_SUBJECT_LENGTH,
    compile_pattern,
    subject_matches,
    validate_pattern,
    validate_subject,
)

TABLE = [
    # pattern, subject, matches
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.b.c", "a.b.c.d", False),
    ("a.b.c", "a.B.c", False),  # case-sensitive
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),  # * is exactly one word
    ("a.*.c", "a.b.b.c", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*.*", "a.b", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("a.#", "a", True),  # zero words
    ("a.#", "a.b", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("a.#", "ab", False),
    ("#.c", "c", True),
    ("#.c", "a.b.c", True),
    ("#.c", "a.c.d", False),
    ("a.#.c", "a.c", True),
    ("a.#.c", "a.b.c", True),
    ("a.#.c", "a.b.x.c", True),
    ("a.#.c", "a.b.x.d", False),
    ("a.#.c", "a.c.c", True),
    ("#.#", "a", True),
    ("#.*", "a", True),
    ("#.*", "a.b.c", True),
    ("*.#", "a", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("#.a.#", "a", True),
    ("#.a.#", "x.a.y.z", True),
    ("#.a.#", "x.b.y", False),
    ("#.b.#.d", "a.b.c.d", True),
    ("#.b.#.d", "a.b.c.e", False),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c.d", True),
    ("quotes.bovespa.*", "quotes.bovespa.PETR4", True),
    ("quotes.#", "quotes.bovespa.PETR4", True),
    ("a-b.c_d", "a-b.c_d", True),
    ("né.*", "né.ü", True),
]


@pytest.mark.parametrize(("pattern", "subject", "expected"), TABLE)
def test_matching_table(pattern: str, subject: str, expected: bool) -> None:
    assert compile_pattern(pattern)(subject) is expected
    assert subject_matches(pattern, subject) is expected


@pytest.mark.parametrize("subject", ["", "a..b", ".a", "a.", "..", ".", "x" * 256])
def test_structurally_invalid_subjects_never_match(subject: str) -> None:
    assert not compile_pattern("#")(subject)
    assert not compile_pattern("#.#.*")(subject)
    assert not compile_pattern("a.b")(subject)
    with pytest.raises(SubjectError):
        validate_subject(subject)


def test_a_pattern_without_wildcards_keeps_no_words() -> None:
    """A broker holds one such subscription per device: no word tuple each."""
    exact = compile_pattern("quotes.bovespa.PETR4")
    assert exact.exact and exact.words is None
    assert exact("quotes.bovespa.PETR4")
    assert not exact("quotes.bovespa.PETR3")
    assert not exact("quotes.bovespa")
    wild = compile_pattern("quotes.*.PETR4")
    assert not wild.exact and wild.words == ("quotes", "*", "PETR4")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty subject"),
        ("a..b", "empty word"),
        (".a", "empty word"),
        ("a.", "empty word"),
        ("a*", "no wildcards"),
        ("a.*", "no wildcards"),
        ("a.#", "no wildcards"),
        ("a b", "whitespace"),
        ("a\nb", "whitespace"),
        ("x" * (MAX_SUBJECT_LENGTH + 1), "longer than 255"),
    ],
)
def test_validate_subject_errors(text: str, fragment: str) -> None:
    with pytest.raises(SubjectError, match=re.escape(fragment)):
        validate_subject(text)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty pattern"),
        ("a..b", "empty word"),
        ("a*", "must be a whole word"),
        ("*a", "must be a whole word"),
        ("a.b#", "must be a whole word"),
        ("**", "must be a whole word"),
        ("a b", "whitespace"),
        ("x" * (MAX_SUBJECT_LENGTH + 1), "longer than 255"),
    ],
)
def test_validate_pattern_errors(text: str, fragment: str) -> None:
    with pytest.raises(SubjectError, match=re.escape(fragment)):
        validate_pattern(text)
    with pytest.raises(SubjectError):
        compile_pattern(text)


def test_non_text_is_refused() -> None:
    with pytest.raises(SubjectError, match="must be text"):
        validate_subject(5)
    with pytest.raises(SubjectError, match="must be text"):
        validate_pattern(None)


def test_valid_ones_are_returned() -> None:
    assert validate_subject("a.b") == "a.b"
    assert validate_pattern("a.*.#") == "a.*.#"
    assert validate_subject("x" * MAX_SUBJECT_LENGTH) == "x" * MAX_SUBJECT_LENGTH


def test_many_hashes_stay_fast() -> None:
    # A backtracking matcher is exponential here; the DP is not.
    pattern = ".".join(["#", "a"] * 40 + ["b"])
    subject = ".".join(["a"] * 120)
    assert not compile_pattern(pattern)(subject)


# Reference: AMQP semantics by a regex over words, on tiny alphabets.
def _reference(pattern: str, subject: str) -> bool:
    parts: list[str] = []
    for word in pattern.split("."):
        if word == "#":
            parts.append(r"(?:[^.]+\.)*")
        elif word == "*":
            parts.append(r"[^.]+\.")
        else:
            parts.append(re.escape(word) + r"\.")
    return re.fullmatch("".join(parts), subject + ".") is not None


words = st.sampled_from(["a", "b", "c"])


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(words, st.sampled_from(["*", "#"])), min_size=1, max_size=6).map(".".join),
    st.lists(words, min_size=1, max_size=6).map(".".join),
)
def test_matcher_agrees_with_reference(pattern: str, subject: str) -> None:
    assert compile_pattern(pattern)(subject) == _reference(pattern, subject)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_random_text_is_a_pattern_or_subject_error(text: str) -> None:
    try:
        validate_pattern(text)
    except SubjectError:
        return
    compile_pattern(text)
