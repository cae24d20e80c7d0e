"""The churn log's vocabulary has one definition: the event list of docs/protocol.md §8
and the analytics' reading of it agree with ``mdeci/churnlog.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mdeci.churnlog import Event


def _protocol_events() -> list[str]:
    """The event list of docs/protocol.md §8 (the paragraph that starts "Events:")."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text("utf-8")
    section = text[text.index("## §8") :]
    paragraph = section[section.index("Events:") :].split("\n\n", 1)[0]
    return re.findall(r"`([a-z_]+)`", paragraph)


PROTOCOL_EVENTS = _protocol_events()


def test_events_are_exactly_the_protocol_ones() -> None:
    assert sorted(e.value for e in Event) == sorted(PROTOCOL_EVENTS)


def test_the_analytics_reference_knows_every_event() -> None:
    """The plain-Python oracle of the Spark jobs (tests/analytics/reference.py) keeps its
    own lists, written independently; they name the same events and agent facts."""
    from mdeci.churnlog import AGENT_EVENTS
    from tests.analytics import reference

    assert {e.value for e in Event} == reference.EVENTS
    assert {e.value for e in AGENT_EVENTS} == reference.AGENT_EVENTS


def test_the_analytics_read_the_vocabulary_defined_here() -> None:
    from analytics.vocabulary import read
    from mdeci.churnlog import AGENT_EVENTS, OPTIONAL_FIELDS

    vocabulary = read()
    assert vocabulary.events == tuple(e.value for e in Event)
    assert vocabulary.agent_events == tuple(e.value for e in AGENT_EVENTS)
    assert tuple(name for name, _ in vocabulary.fields) == OPTIONAL_FIELDS
    kinds = dict(vocabulary.fields)
    assert kinds["missed"] == kinds["nseq"] == "count" and kinds["published"] == "text"


def test_a_vocabulary_file_without_the_definitions_is_refused(tmp_path: Path) -> None:
    from analytics.errors import VocabularyError
    from analytics.vocabulary import read

    (tmp_path / "churnlog.py").write_text("class Event:\n    A = 'a'\n", encoding="utf-8")
    with pytest.raises(VocabularyError, match="does not define"):
        read(tmp_path / "churnlog.py")
    with pytest.raises(VocabularyError, match="cannot read"):
        read(tmp_path / "missing.py")
