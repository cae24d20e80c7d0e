"""The churn-log vocabulary, read from its one definition: ``mdeci/churnlog.py``.

The writer's module defines the events (``class Event``), which of them the agent's line
is the fact for (``AGENT_EVENTS``) and the optional fields with their types
(``class ChurnFields``). The analytics are the lower layer and import nothing of mdeci
(tests/test_layering.py), so they read those three definitions from the file's text
with :mod:`ast`, which runs none of it. Both packages ship side by side in the one
distribution; a copy of the list would be a second source that drifts.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from analytics.errors import VocabularyError

SOURCE = Path(__file__).resolve().parent.parent / "mdeci" / "churnlog.py"

# The type of an optional field as ChurnFields annotates it -> its kind in the schema.
KINDS = {"str": "text", "int": "count", "float": "number"}


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """The events in §8 order, the agent's ones, and the optional fields with kinds."""

    events: tuple[str, ...]
    agent_events: tuple[str, ...]
    fields: tuple[tuple[str, str], ...]


def read(source: Path = SOURCE) -> Vocabulary:
    """The vocabulary defined in ``source``.

    Raises:
        VocabularyError: if the file cannot be read or lacks one of the definitions.
    """
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    except (OSError, SyntaxError) as exc:
        raise VocabularyError(f"cannot read the churn-log vocabulary from {source}: {exc}") from exc
    members: dict[str, str] = {}
    fields: list[tuple[str, str]] = []
    agent: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Event":
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and isinstance(item.targets[0], ast.Name)
                    and isinstance(item.value, ast.Constant)
                ):
                    members[item.targets[0].id] = str(item.value.value)
        elif isinstance(node, ast.ClassDef) and node.name == "ChurnFields":
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    kind = ast.unparse(item.annotation).split("|")[0].strip()
                    if kind not in KINDS:
                        raise VocabularyError(f"field {item.target.id} has an unknown type {kind}")
                    fields.append((item.target.id, KINDS[kind]))
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "AGENT_EVENTS":
                assert node.value is not None
                agent = [e.attr for e in ast.walk(node.value) if isinstance(e, ast.Attribute)]
    if not members or not fields or not agent:
        raise VocabularyError(f"{source} does not define Event, ChurnFields and AGENT_EVENTS")
    try:
        agent_events = tuple(members[name] for name in agent)
    except KeyError as exc:
        raise VocabularyError(f"AGENT_EVENTS names an unknown event {exc}") from None
    return Vocabulary(tuple(members.values()), agent_events, tuple(fields))


VOCABULARY = read()
