"""Subjects and subscription patterns of docs/protocol.md §5 (filters: ``mdeci.filters``).

Theory of operation
-------------------
*Subjects* are dot-separated words (``quotes.bovespa.PETR4``). A *pattern* is a subject
whose words may also be ``*`` (exactly one word) or ``#`` (zero or more words), as AMQP
topic exchanges do. :func:`compile_pattern` turns a pattern into a matcher once; matching
is a dynamic programme over words, so patterns with many ``#`` stay linear-ish and never
backtrack exponentially (a regular expression would). A pattern without wildcards
matches its own text alone, compared as it is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from mdeci.errors import SubjectError

MAX_SUBJECT_LENGTH = 255  # characters; AMQP 0-9-1 routing keys are short strings too
ONE_WORD = "*"
ANY_WORDS = "#"


def _check_word(word: str, text: str, *, wildcards: bool) -> None:
    if not word:
        raise SubjectError(f"empty word in {text!r} (words are separated by single dots)")
    if wildcards and word in (ONE_WORD, ANY_WORDS):
        return
    for ch in word:
        if ch in "*#":
            what = "a wildcard must be a whole word" if wildcards else "no wildcards allowed"
            raise SubjectError(f"{ch!r} inside word {word!r} of {text!r}: {what}")
        if ch.isspace() or not ch.isprintable():
            raise SubjectError(f"whitespace or control character in {text!r}")


def _split(text: object, *, wildcards: bool) -> tuple[str, ...]:
    kind = "pattern" if wildcards else "subject"
    if not isinstance(text, str):
        raise SubjectError(f"{kind} must be text, not {type(text).__name__}")
    if not text:
        raise SubjectError(f"empty {kind}")
    if len(text) > MAX_SUBJECT_LENGTH:
        raise SubjectError(f"{kind} longer than {MAX_SUBJECT_LENGTH} characters")
    words = tuple(text.split("."))
    for word in words:
        _check_word(word, text, wildcards=wildcards)
    return words


def validate_subject(subject: object) -> str:
    """Return ``subject`` if it is a concrete subject (words, no wildcards).

    Raises :class:`SubjectError` naming the fault otherwise.
    """
    _split(subject, wildcards=False)
    assert isinstance(subject, str)
    return subject


def validate_pattern(pattern: object) -> str:
    """Return ``pattern`` if it is a valid subscription pattern (words, ``*``, ``#``).

    Raises :class:`SubjectError` naming the fault otherwise.
    """
    _split(pattern, wildcards=True)
    assert isinstance(pattern, str)
    return pattern


@dataclass(frozen=True, slots=True)
class SubjectMatcher:
    """A compiled subscription pattern; call it with a concrete subject.

    ``words`` is None for a pattern without wildcards: it matches its own text alone, and
    a broker holding one such subscription per device keeps no word tuple for each.
    """

    pattern: str
    words: tuple[str, ...] | None = field(repr=False)

    @property
    def exact(self) -> bool:
        """The pattern has no wildcard: it matches the one subject equal to it."""
        return self.words is None

    def __call__(self, subject: str) -> bool:
        """True when ``subject`` matches.

        Subjects are validated once where they enter (``Pub``/``Notify`` frames); here only
        the structural faults (empty, too long, empty word) are caught, so that matching
        one subject against many patterns stays cheap. Such a subject matches nothing.
        """
        if self.words is None:
            return subject == self.pattern  # a valid pattern: no empty word, not too long
        if not subject or len(subject) > MAX_SUBJECT_LENGTH:
            return False
        words = tuple(subject.split("."))
        return "" not in words and _match_words(self.words, words)


# A broker compiles a pattern and a filter per subscription, and subscriptions mostly
# share their texts: the compiled ones are immutable, so equal texts share one.
COMPILED_CACHE = 4096


@functools.lru_cache(maxsize=COMPILED_CACHE)
def compile_pattern(pattern: str) -> SubjectMatcher:
    """Compile a subscription pattern once; raises :class:`SubjectError` if invalid."""
    words = _split(pattern, wildcards=True)
    if ONE_WORD not in words and ANY_WORDS not in words:
        return SubjectMatcher(pattern=pattern, words=None)
    # '#.#' means the same as '#'; collapsing runs keeps the DP table small.
    collapsed: list[str] = []
    for word in words:
        if word == ANY_WORDS and collapsed and collapsed[-1] == ANY_WORDS:
            continue
        collapsed.append(word)
    return SubjectMatcher(pattern=pattern, words=tuple(collapsed))


def subject_matches(pattern: str, subject: str) -> bool:
    """One-shot :func:`compile_pattern` + match; raises :class:`SubjectError` on a bad pattern."""
    return compile_pattern(pattern)(subject)


def _match_words(pattern: tuple[str, ...], subject: tuple[str, ...]) -> bool:
    if ANY_WORDS not in pattern:
        # The common case: same length, word by word.
        return len(pattern) == len(subject) and all(
            p in (ONE_WORD, s) for p, s in zip(pattern, subject, strict=True)
        )
    # reachable[j]: the pattern prefix seen so far can consume exactly subject[:j].
    n = len(subject)
    reachable = [True] + [False] * n
    for p in pattern:
        if p == ANY_WORDS:
            # '#' consumes zero or more words: everything right of the first reachable j.
            seen = False
            for j in range(n + 1):
                seen = seen or reachable[j]
                reachable[j] = seen
        else:
            nxt = [False] * (n + 1)
            for j in range(n):
                if reachable[j] and (p == ONE_WORD or p == subject[j]):
                    nxt[j + 1] = True
            reachable = nxt
    return reachable[n]
